"""Replicated broker groups (``equeue_broker.cluster``): master election and epoch
fencing through ZooKeeper (``election``). See docs/replication.md.

This layer may use the storage layer and the contract, never the server, the
client or Spark; the server calls into it.
"""

from equeue_broker.cluster.election import (
    Candidate,
    ElectionError,
    Epoch,
    GroupElection,
    GroupView,
    Layout,
    NotMaster,
    Role,
    StaleEpoch,
    parse_hosts,
)

__all__ = [
    "Candidate",
    "ElectionError",
    "Epoch",
    "GroupElection",
    "GroupView",
    "Layout",
    "NotMaster",
    "Role",
    "StaleEpoch",
    "parse_hosts",
]
