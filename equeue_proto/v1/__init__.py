"""equeue.v1: the broker contract, version 1."""
