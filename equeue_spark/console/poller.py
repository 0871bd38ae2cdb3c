"""The poller: one thread asking the cluster for its figures every
``interval`` seconds through the client's ``Admin`` (one client shape for one
broker or a cluster: ``Routes``), building a ``Snapshot`` and the round's
history points, and handing both to ``publish``.

Rounds never overlap: one longer than the interval starts the next at once
(``overruns``). A step that fails keeps the previous round's section, marked
stale, and says why in ``Snapshot.errors``: the console keeps serving while
brokers or name servers are away. A member that does not answer its
``GetStats`` within ``probe_timeout_s`` is ``unreachable`` in that round.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.admin import Admin, MemberStats
from equeue_spark.client.cluster import connect
from equeue_spark.client.connection import ClientConfig
from equeue_spark.client.errors import EqueueError, NotFoundError
from equeue_spark.client.routing import Routes
from equeue_spark.console.history import Rates, SeriesKey
from equeue_spark.console.snapshot import (
    EMPTY,
    Row,
    Snapshot,
    group_row,
    member_row,
    topic_row,
    topic_sizes,
    transaction_rows,
)

log = logging.getLogger("equeue.console.poller")

Publish = Callable[[Snapshot, dict[SeriesKey, float]], None]
SCHEMA_EVERY = 6
"""Rounds between asking each topic's schema (schemas change seldom)."""
DESCRIBE_THREADS = 8
"""Groups described at once in a round."""


class Poller:
    """Polls ``config``'s broker or cluster; ``publish(snapshot, points)`` is
    called from the poller thread after each round."""

    def __init__(
        self,
        config: ClientConfig,
        publish: Publish,
        *,
        interval_s: float = 5.0,
        max_groups: int = 1000,
        probe_timeout_s: float = 2.0,
    ) -> None:
        self.config = config
        self.publish = publish
        self.interval_s = interval_s
        self.max_groups = max_groups
        self.probe_timeout_s = probe_timeout_s
        self.admin = Admin(config=config)
        self.snapshot: Snapshot = EMPTY
        self.rates = Rates()
        self.overruns = 0
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="equeue-console-poller", daemon=True)
        self._brokers: dict[str, Admin] = {}
        self._names: dict[str, Routes] = {}
        self._schemas: dict[str, Row | None] = {}
        """Each topic's value schema, asked every ``SCHEMA_EVERY`` rounds."""
        self._uptimes: dict[str, float] = {}
        self._generations: dict[str, int] = {}
        """Restarts seen per member address (its counters started again)."""
        self._topic_rates: dict[str, list[float | None]] = {}
        """{topic: [in msg/s, out msg/s]} of the round's members (None: no rate yet)."""

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        for admin in self._brokers.values():
            admin.close()
        for routes in self._names.values():
            routes.close()
        self.admin.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                snapshot, points = self.poll_once()
                self.snapshot = snapshot
                self.publish(snapshot, points)
            except Exception:  # a bug in one round must not end the console's polling
                log.exception("poll round failed")
            elapsed = time.monotonic() - started
            if elapsed > self.interval_s:
                self.overruns += 1
            self._stop.wait(max(0.0, self.interval_s - elapsed))

    # -- one round ---------------------------------------------------------------------

    def poll_once(self) -> tuple[Snapshot, dict[SeriesKey, float]]:
        """One round: the snapshot and its history points."""
        started = time.monotonic()
        at_ms = int(time.time() * 1000)
        previous = self.snapshot
        errors: list[str] = []
        stale: set[str] = set()
        points: dict[SeriesKey, float] = {}

        members = self._step(errors, "members", lambda: self._members(points))
        if members is None:
            members = self._stale_members(previous, errors[-1])
            stale.add("members")
        topics = self._step(errors, "topics", lambda: self._topics(members, points))
        if topics is None:
            topics = list(previous.topics)
            stale.add("topics")
        groups = self._step(errors, "groups", lambda: self._groups(topics, points))
        if groups is None:
            groups = list(previous.groups)
            stale.add("groups")
        transactions = self._step(errors, "transactions", lambda: self._transactions(members))
        if transactions is None:
            transactions = list(previous.transactions)
            stale.add("transactions")
        namesrvs = self._namesrvs()
        snapshot = Snapshot(
            round=self.rounds,
            at_ms=at_ms,
            members=tuple(members),
            topics=tuple(topics),
            groups=tuple(groups),
            transactions=tuple(transactions),
            namesrvs=tuple(namesrvs),
            errors=tuple(errors),
            poll_seconds=time.monotonic() - started,
            stale=frozenset(stale),
        )
        self.rounds += 1
        return snapshot, points

    @staticmethod
    def _stale_members(previous: Snapshot, why: str) -> list[Row]:
        """The last known members, none of them answering now (the name
        servers, or the one broker, could not be asked)."""
        return [{**m, "state": "unreachable", "error": why} for m in previous.members]

    @staticmethod
    def _step(errors: list[str], what: str, call: Callable[[], list[Row]]) -> list[Row] | None:
        try:
            return call()
        except EqueueError as exc:
            errors.append(f"{what}: {exc}")
            return None

    def _members(self, points: dict[SeriesKey, float]) -> list[Row]:
        found = self.admin.cluster_stats(timeout_s=self.probe_timeout_s)
        now_s = time.time()
        rows = []
        counters: list[tuple[str, ...]] = []
        self._topic_rates = {}
        for member in found:
            rows.append(self._member(member, now_s, points, counters))
        self.rates.forget_except(counters)
        return rows

    def _member(
        self, member: MemberStats, now_s: float, points: dict[SeriesKey, float],
        counters: list[tuple[str, ...]],
    ) -> Row:  # fmt: skip
        stats = member.stats
        address = member.entry.address or self.config.target
        if stats is None:
            return member_row(member, None, None)
        # A restart resets the counters: a smaller uptime starts a new
        # generation, and a counter's rate never spans two generations.
        last_uptime = self._uptimes.get(address)
        if last_uptime is not None and stats.uptime_s < last_uptime:
            self._generations[address] = self._generations.get(address, 0) + 1
        self._uptimes[address] = stats.uptime_s
        epoch = f"{member.entry.instance_id}/{stats.broker_id}/{self._generations.get(address, 0)}"
        is_master = (stats.role or "master") == "master"
        for qc in stats.queue_counters:
            for kind, value in (("in", qc.produced), ("out", qc.consumed)):
                if kind == "in" and not is_master:
                    continue  # a replica's produced counts the master's writes again
                key = (kind, address, qc.topic, str(qc.queue_id))
                counters.append(key)
                rate = self.rates.rate(key, epoch, value, now_s)
                pair = self._topic_rates.setdefault(qc.topic, [None, None])
                index = 0 if kind == "in" else 1
                if rate is not None:
                    pair[index] = (pair[index] or 0.0) + rate
        points[("member_in", (address,))] = stats.produce_rate
        points[("member_out", (address,))] = stats.consume_rate
        for replica in stats.replicas:
            points[("replica_lag", (member.entry.broker_name, replica.address))] = float(
                replica.lag_bytes
            )
        if is_master:
            points[("unconsumed", (member.entry.broker_name,))] = float(stats.total_backlog)
        return member_row(member, stats.produce_rate, stats.consume_rate)

    def _topics(self, members: list[Row], points: dict[SeriesKey, float]) -> list[Row]:
        rates = {t: (pair[0], pair[1]) for t, pair in self._topic_rates.items()}
        listed = self.admin.list_topics()
        if self.rounds:  # no counter at all since the brokers started: nothing moved
            for info in listed:
                rates.setdefault(info.name, (0.0, 0.0))
        rows = [topic_row(info, rates) for info in listed]
        retention = {
            m["broker"]: {
                "max_age_ms": m["stats"]["retention_max_age_ms"],
                "max_bytes": m["stats"]["retention_max_bytes"],
            }
            for m in members
            if m["stats"] is not None and m["role"] == "master"
        }
        if self.rounds % SCHEMA_EVERY == 0:
            self._schemas = {r["name"]: self._schema(r["name"]) for r in rows if not r["internal"]}
        for row in rows:
            row["retention"] = [
                {"broker": b, **retention[b]} for b in row["brokers"] if b in retention
            ]
            row["schema"] = self._schemas.get(row["name"])
        for row in rows:
            for kind, value in (("topic_in", row["in_rate"]), ("topic_out", row["out_rate"])):
                if value is not None:
                    points[(kind, (row["name"],))] = value
        return rows

    def _schema(self, topic: str) -> Row | None:
        """The topic's value schema: type and latest version; None without one."""
        try:
            info = self.admin.get_schema(topic)
        except NotFoundError:
            return None
        except EqueueError as exc:
            return {"error": str(exc)}
        latest = info.versions[-1] if info.versions else None
        kind = pb.SchemaType.Name(latest.type).removeprefix("SCHEMA_TYPE_") if latest else ""
        return {"version": info.latest_version, "type": kind}

    def _groups(self, topics: list[Row], points: dict[SeriesKey, float]) -> list[Row]:
        names = self.admin.list_groups()[: self.max_groups]
        sizes = topic_sizes(topics)

        def describe(group: str) -> Row | None:
            try:
                return group_row(self.admin.describe_group(group), sizes)
            except NotFoundError:  # deleted between the list and now
                return None

        with ThreadPoolExecutor(DESCRIBE_THREADS, thread_name_prefix="equeue-console") as pool:
            found = [row for row in pool.map(describe, names) if row is not None]
        for row in found:
            for topic in row["topics"]:
                key = (row["group"], topic["topic"])
                points[("group_lag", key)] = float(topic["lag"])
                points[("group_lag_seconds", key)] = topic["lag_ms"] / 1000
        return found

    def _transactions(self, members: list[Row]) -> list[Row]:
        now_ms = int(time.time() * 1000)
        rows: list[Row] = []
        for member in members:
            if member["state"] not in ("live", "suspect") or member["role"] != "master":
                continue
            if member["stats"] is None:
                continue
            admin = self._broker(member["address"])
            try:
                reply = admin.list_transactions()
            except EqueueError as exc:
                log.info("transactions of %s: %s", member["broker"] or member["address"], exc)
                continue
            rows.extend(transaction_rows(member["broker"], reply, now_ms))
        return rows

    def _namesrvs(self) -> list[Row]:
        """Ask each name server alone for its members: up, or down and why."""
        rows: list[Row] = []
        for address in self.config.namesrvs():
            routes = self._names.get(address)
            if routes is None:
                routes = connect(dataclasses.replace(self.config, namesrv=(address,)))
                self._names[address] = routes
            try:
                listed = routes.brokers(include_down=True)
            except EqueueError as exc:
                rows.append({"address": address, "state": "down", "brokers": 0, "error": str(exc)})
                continue
            rows.append({"address": address, "state": "up", "brokers": len(listed), "error": ""})
        return rows

    def _broker(self, address: str) -> Admin:
        """An ``Admin`` of one member (its own figures)."""
        admin = self._brokers.get(address)
        if admin is None:
            target = address or self.config.target
            admin = Admin(config=self.admin.routes.config.for_broker(target))
            self._brokers[address] = admin
        return admin


def describe(snapshot: Snapshot) -> dict[str, Any]:
    """The round's header every JSON reply carries."""
    return {
        "round": snapshot.round,
        "at_ms": snapshot.at_ms,
        "errors": list(snapshot.errors),
        "stale": sorted(snapshot.stale),
    }
