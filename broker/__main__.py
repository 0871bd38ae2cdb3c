"""``python -m broker``: run the broker (same as ``equeue-broker``)."""

from broker.server.app import main

main()
