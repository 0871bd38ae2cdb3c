"""The errors replication raises; the server maps them to gRPC statuses
and error kinds (server/errors.py, the one place that does)::

    StorageError
    ├── PreconditionFailed ── ReplicaReadOnly  a write sent to a replica
    │                      └── StaleEpoch       a request from an older group epoch
    └── NotEnoughReplicas                      sync replication: too few in-sync replicas
"""

from __future__ import annotations

from equeue_broker.storage.errors import PreconditionFailed, StorageError


class ReplicaReadOnly(PreconditionFailed):
    """A write (produce, commit, admin change) sent to a replica: FAILED_PRECONDITION,
    not UNAVAILABLE, because retrying the same broker can never succeed; the
    message names the master to send it to."""


class StaleEpoch(PreconditionFailed):
    """A request stamped with a group epoch older than the newest this broker has
    seen: it comes from a deposed master (docs/replication.md, "Fencing")."""


class NotEnoughReplicas(StorageError):
    """Sync replication: fewer in-sync members than ``--min-insync-replicas``, or
    the in-sync replicas did not confirm in time. UNAVAILABLE (retryable, like
    Kafka's NOT_ENOUGH_REPLICAS); the message names the group. Nothing the
    request wrote is acknowledged."""
