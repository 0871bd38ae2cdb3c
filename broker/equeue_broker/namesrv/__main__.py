"""``python -m equeue_broker.namesrv``: run a name server (same as ``equeue-namesrv``)."""

from equeue_broker.namesrv.app import main

main()
