"""Replication (``equeue_broker.replication``): master/replica groups, as
RocketMQ's ``store/ha/`` sits beside its store. See docs/replication.md.

- replica_log.py: a replica's apply of its master's log bytes (``ReplicaLog``)
  and the group-metadata document;
- master_log.py: what a master reads for a replica (``read_for_replica``);
- master.py: the master side of a replication stream (divergence, fencing,
  ``LogGrowth``); the gRPC servicer is the server's (service_replication.py);
- replicas.py, insync.py, pipelined.py: the replicas a master tracks, its
  in-sync set and the waits of sync replication, a stream's pipelined acks;
- follower.py: a replica's replication loop;
- role.py, failover.py, election.py: the broker's role, promotion and
  following, and the ZooKeeper election with epoch fencing;
- wire.py: a replication reply's wire format (log bytes not copied);
- errors.py: the errors replication raises (the server maps them to statuses).

This layer uses storage (through ``Store``'s public API) and the contract,
never the server, the client or Spark; the server calls into it. Nothing is
re-exported here: importing one module loads only what it needs.
"""
