"""``python -m equeue_broker``: run the broker (same as ``equeue-broker``)."""

from equeue_broker.server.app import main

main()
