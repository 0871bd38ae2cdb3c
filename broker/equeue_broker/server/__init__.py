"""The equeue broker: a gRPC server (grpc.aio) over the storage engine."""
