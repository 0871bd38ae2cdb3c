"""Generated gRPC contract of the equeue broker (see protos/).

Do not edit the *_pb2* files: run ``make proto``.
"""
