"""``equeue cluster promote GROUP``: an operator's epoch-fenced failover.

For a group run without ZooKeeper (``--role`` at start). The members are the
brokers given with ``--brokers`` (or the group's brokers the name servers
know, plus the replicas its master reports). Each is asked for its stats
(role, epoch, log end); the new master is the most advanced in-sync replica:
in sync by the master's own account when the master answers, else (the
master is down) the reachable replica with the greatest log end, which is
said. The new epoch is one above every epoch seen: the promoted replica
writes its epoch marker and takes writes; every other reachable member,
an old master included, is told to follow it from that epoch (an old master's
unreplicated tail is truncated when it does).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli.common import CliError, UsageError, client_config, split_names
from equeue_spark.cli.formatting import Output
from equeue_spark.client.admin import Admin
from equeue_spark.client.errors import EqueueError, InvalidRequest


@dataclass
class Member:
    address: str
    stats: pb.BrokerStats | None
    error: str = ""


def cmd_cluster_promote(args: argparse.Namespace, ui: Output) -> None:
    addresses = _member_addresses(args)
    members = [_ask(args, a) for a in addresses]
    members += [_ask(args, a) for a in _reported_replicas(members, addresses)]
    live = [m for m in members if m.stats is not None]
    for m in members:
        if m.stats is None:
            ui.line(f"{m.address}: unreachable ({m.error})")
        elif m.stats.broker_id != args.group:
            raise CliError(
                f"{m.address} is broker {m.stats.broker_id!r}, not of group {args.group!r}"
            )
        elif m.stats.failover == "zookeeper":
            raise CliError(
                f"group {args.group}: this group fails over through ZooKeeper ({m.address}); "
                "its members elect the master themselves"
            )
    chosen, why = _choose(live)
    assert chosen.stats is not None
    epoch = max(m.stats.epoch for m in live if m.stats is not None) + 1
    _set_role(args, chosen.address, "master", "", epoch)
    ui.line(f"promoted {chosen.address} to master of group {args.group}, epoch {epoch} ({why})")
    failed = []
    for m in live:
        if m is chosen:
            continue
        assert m.stats is not None
        try:
            _set_role(args, m.address, "replica", chosen.address, epoch)
        except CliError as exc:  # the others still follow; this one is reported
            failed.append(str(exc))
            continue
        ui.line(f"{m.address} (was {m.stats.role}) follows {chosen.address} from epoch {epoch}")
    if failed:
        raise CliError(f"promoted {chosen.address}, but: {'; '.join(failed)}")


def _member_addresses(args: argparse.Namespace) -> list[str]:
    """The group's members: ``--brokers``, or the name servers' registrations
    (the routes decide which applies)."""
    with Admin(config=client_config(args)) as admin:
        try:
            return admin.routes.group_members(args.group, split_names(args.brokers))
        except InvalidRequest:
            raise UsageError(
                "give the group's brokers (--brokers HOST:PORT,...) or --namesrv, one of them"
            ) from None


def _reported_replicas(members: list[Member], known: list[str]) -> list[str]:
    """Replicas the reachable masters report that were not named."""
    out: list[str] = []
    for m in members:
        if m.stats is not None and m.stats.role == "master":
            out += [r.address for r in m.stats.replicas if r.address not in known + out]
    return out


def _ask(args: argparse.Namespace, address: str) -> Member:
    try:
        with Admin(config=client_config(args).for_broker(address)) as admin:
            return Member(address, admin.stats())
    except EqueueError as exc:
        return Member(address, None, str(exc))


def _choose(live: list[Member]) -> tuple[Member, str]:
    """The replica to promote, and why it was chosen."""
    masters = [m for m in live if m.stats is not None and m.stats.role == "master"]
    replicas = [m for m in live if m.stats is not None and m.stats.role == "replica"]
    if not replicas:
        raise CliError("no reachable replica to promote (give every member with --brokers)")
    if masters:
        master = max(masters, key=lambda m: m.stats.epoch if m.stats else 0)
        assert master.stats is not None
        in_sync = _in_sync(master.stats)
        eligible = [m for m in replicas if m.address in in_sync]
        if not eligible:
            raise CliError(
                f"no replica is in sync with master {master.address} (its replicas: "
                f"{', '.join(sorted(in_sync)) or 'none in sync'}): promoting one would lose "
                "acknowledged writes; let them catch up"
            )
        best = max(eligible, key=_log_end)
        return best, f"in sync with master {master.address}, log end {_log_end(best)}"
    best = max(replicas, key=_log_end)
    return best, (
        f"no master answered: the reachable replica with the greatest log end "
        f"({_log_end(best)}); its master may have held more"
    )


def _in_sync(master: pb.BrokerStats) -> set[str]:
    """The addresses of the replicas the master counts in sync (its in-sync set)."""
    return {r.address for r in master.replicas if r.in_sync}


def _log_end(member: Member) -> int:
    return member.stats.log_end_position if member.stats is not None else -1


def _set_role(args: argparse.Namespace, address: str, role: str, master: str, epoch: int) -> None:
    try:
        with Admin(config=client_config(args).for_broker(address)) as admin:
            admin.set_role(role, master, epoch)
    except EqueueError as exc:
        raise CliError(f"{address}: SetRole {role} epoch {epoch} failed: {exc}") from exc
