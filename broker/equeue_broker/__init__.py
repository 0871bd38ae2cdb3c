"""equeue's broker (import name ``equeue_broker``; the folder is ``broker/``):
a persistent message queue following the EQueue/RocketMQ design.

Layers: ``storage`` (the engine; imports only the contract ``equeue_proto``)
<- ``server`` (gRPC). ``testing`` starts real broker processes for tests.
"""

from equeue_proto import __version__

__all__ = ["__version__"]
