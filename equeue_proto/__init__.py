"""The equeue contract: what the broker and its clients share.

- ``v1``: the gRPC code generated from ``protos/equeue_proto/v1/broker.proto``
  (do not edit the ``*_pb2*`` files: run ``make proto``);
- ``record``: the record format pull replies carry (specified there);
- ``accel``: the one loader of the C accelerator ``_codec``;
- ``protocol``: rules both sides apply (queue allocation, message ids);
- ``allocator``: malloc tuning for processes that move large replies.

It imports neither the broker nor the client, and is the one place the
distribution's version lives.
"""

__version__ = "0.2.0"
