"""Screenshots of the web console for docs/operations.md (``make console-shots``).

``python -m tests.support.console_shots --out docs/images [--seconds 75]``
starts a demo cluster on 127.0.0.1 (one name server; broker group ``a``, a
master and its replica; broker group ``b``), gives it topics and traffic that
make every page say something, starts ``equeue-console`` against it, and has
a real headless Chromium (tests/support/browser.py) write one PNG per page:

- ``orders``: 8 queues (4 per broker group), an Avro value schema, produced by
  a validating producer at a rate that rises and falls; group ``billing``
  consumes it more slowly than it arrives, so its lag grows (and the lag alarm
  fires) and the rate and lag plots have shape;
- ``audit``: a steady trickle, read by group ``archiver``, which keeps up;
- ``payments``: read by ``billing`` too; 3 poison messages that ``billing``
  gives back until they land in ``%DLQ%billing``; one delayed message;
- one open transaction on broker group ``a``.

The console polls every second and is started with a tokens file; the browser
logs in with the admin token, so the admin buttons show. Each page is shot at
1280x800 once it has applied a poll round. Every process started here is
stopped by its PID (SIGTERM, then SIGKILL) when the run ends, also on error or
Ctrl-C. Problems the browser logs (JavaScript errors, CSP violations) are
printed, and make the exit code 1.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from equeue_broker.testing import HOST, BrokerProcess, LocalCluster
from equeue_spark.client import Admin, ClientConfig, Consumer, NotFoundError, Producer
from tests.support.waits import wait_for

if TYPE_CHECKING:  # selenium is imported when the shots are taken
    from selenium.webdriver import Chrome

WIDTH, HEIGHT = 1280, 800
"""The size of every screenshot (docs/operations.md shows them as they are)."""
ADMIN_TOKEN = "console-shots-admin-secret-0123"
TOKENS = f"""
[[tokens]]
name = "ops"
secret = "{ADMIN_TOKEN}"
roles = ["admin"]
"""
ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount_cents", "type": "long"},
        {
            "name": "currency",
            "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD", "GBP"]},
        },
    ],
}
BILLING_RATE = 150.0
"""Messages a second ``billing`` processes: below the orders' mean rate."""
ALARM_LAG = 100
PAGE_LOAD_TIMEOUT_S = 120


@dataclass(frozen=True)
class Shot:
    name: str
    """The file is ``console-<name>.png``."""
    path: str
    """The page, relative to the console's address."""
    ready: str = ""
    """A JavaScript expression true once the page shows what the shot is for
    (beyond a poll round applied), e.g. the message browser's results."""
    scroll_to: str = ""
    """The id of a card to scroll to the top of the shot (below the nav bar,
    which stays at the top)."""


SHOTS = (
    Shot("cluster", "/"),
    Shot("topics", "/topics"),
    Shot("topic", "/topics/orders"),
    Shot("groups", "/groups"),
    # Scrolled to the dead letters: the admin buttons (resend, purge, reset);
    # the lag plots are on the groups page's shot.
    Shot(
        "group",
        "/groups/billing",
        "document.querySelectorAll('#dlq-card tbody tr').length >= 3",
        scroll_to="dlq-card",
    ),
    Shot(
        "messages",
        "/messages?mode=offset&topic=orders&broker=a&queue=0&offset=0&count=3",
        "(document.getElementById('msg-status') || {dataset: {}}).dataset.state === 'ok'",
    ),
    Shot("transactions", "/transactions"),
    Shot("alarms", "/alarms", "document.querySelectorAll('#alarms-card tbody tr').length > 0"),
)


def shot_file(shot: Shot) -> str:
    return f"console-{shot.name}.png"


class ConsoleProcess(BrokerProcess):
    """``python -m equeue_spark.console``: the broker's ready-line protocol."""

    ready_prefix = "equeue console listening on "

    def __init__(self, workdir: Path, *flags: str) -> None:
        super().__init__(workdir, *flags, module="equeue_spark.console")

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, "--host", HOST, "--port", "0", *self.flags]

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.address + path)
        request.add_header("Authorization", f"Bearer {ADMIN_TOKEN}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def round(self) -> int:
        return int(self.get("/api/v1/cluster")["round"])


ALARM_RULES = """
[defaults]
for = "5s"
resolve_for = "10s"

[[rule]]
name = "dead-letters"
type = "dlq_not_empty"
group = "*"
for = "0s"

[[rule]]
name = "replicas"
type = "replica_out_of_sync"
broker = "*"
for = "30s"
"""


def alarm_flags(root: Path, stack: ExitStack) -> list[str]:
    """Alarm rules that fire in the demo (billing's lag, its dead letters)
    and one that does not, notifying a local webhook receiver; none when this
    console has no alarms (``--alarm-lag`` unknown to it)."""
    shown = subprocess.run(
        [sys.executable, "-m", "equeue_spark.console", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if "--alarm-lag" not in shown.stdout:
        print("console-shots: this console has no --alarm-lag: no alarm will fire", file=sys.stderr)
        return []
    from tests.support.observability import WebhookSink

    hook = WebhookSink().start()
    stack.callback(hook.stop)
    rules = root / "alarms.toml"
    rules.write_text(ALARM_RULES)
    return [
        "--alarm-rules", str(rules), "--alarm-lag", str(ALARM_LAG), "--alarm-for", "5s",
        "--alarm-webhook", hook.url,
    ]  # fmt: skip


# -- the demo cluster ---------------------------------------------------------------


def start_cluster(root: Path, stack: ExitStack) -> LocalCluster:
    """One name server, broker groups ``a`` (master + replica) and ``b``."""
    cluster = LocalCluster(root, broker_flags=("--register-interval-ms", "1000"))
    stack.callback(cluster.stop)  # stops what started, by PID, even if a start fails
    cluster.start(namesrvs=1, brokers=("a", "b"))
    master = cluster.brokers["a"]
    replica = BrokerProcess(
        root / "broker-a-replica", "--broker-name", "a", "--namesrv", cluster.namesrv,
        "--register-interval-ms", "1000", "--role", "replica", "--master", master.address,
    )  # fmt: skip
    cluster.brokers["a-replica"] = replica  # so cluster.stop stops it too
    replica.start()
    return cluster


def create_topics(namesrv: str) -> None:
    with Admin(namesrv=namesrv) as admin:
        admin.create_topic("orders", 4)  # on each of a and b: 8 queues
        admin.create_topic("audit", 2)
        admin.create_topic("payments", 1)
        admin.set_schema("orders", ORDER_SCHEMA)

        def routed() -> bool:  # the brokers register new topics on their own time
            try:
                return all(
                    len(admin.route(t).queues()) == n
                    for t, n in (("orders", 8), ("audit", 4), ("payments", 2))
                )
            except NotFoundError:
                return False

        wait_for("the demo topics routed to both broker groups", routed, 30)


def orders_rate(t: float) -> float:
    """Orders a second at ``t`` seconds: a slow wave plus a burst, mean ~190/s."""
    burst = 250.0 if 25.0 <= t % 60.0 < 35.0 else 0.0
    return 150.0 + 90.0 * math.sin(2 * math.pi * t / 45.0) + burst


@dataclass
class Load:
    """The demo's producers and consumers, in threads, until ``stop``."""

    namesrv: str
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    dead_letters: int = 0
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for target in (self.produce, self.bill, self.archive):
            thread = threading.Thread(
                target=self.guarded(target), name=target.__name__, daemon=True
            )
            thread.start()
            self.threads.append(thread)

    def guarded(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception as exc:  # reported by main, which then stops the run
                self.errors.append(f"{target.__name__}: {type(exc).__name__}: {exc}")
                self.stop.set()

        return run

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def produce(self) -> None:
        started = last = time.monotonic()
        sent, owed = 0, 0.0
        config = ClientConfig(namesrv=self.namesrv, timeout_s=10)
        with Producer(config=config, validate=True, linger_ms=20) as producer:
            while not self.stop.is_set():
                now = time.monotonic()
                owed += orders_rate(now - started) * (now - last)
                last, due = now, int(owed)
                for n in range(sent, due):
                    order = {
                        "id": n, "customer": f"c{n % 37:03d}", "amount_cents": 100 + n * 7 % 9900,
                        "currency": ("EUR", "USD", "GBP")[n % 3],
                    }  # fmt: skip
                    producer.send("orders", order, key=f"c{n % 37:03d}".encode())
                    if n % 5 == 0:
                        producer.send("audit", b'{"event": "order-placed", "order": %d}' % n)
                    if n % 10 == 0:
                        producer.send("payments", b'{"order": %d, "status": "authorized"}' % n)
                producer.flush()
                sent = due
                self.stop.wait(0.25)  # pacing, not a readiness wait

    def bill(self) -> None:
        """Group ``billing``: slower than the orders arrive; poison payments
        are given back until they reach the dead-letter topic."""
        config = ClientConfig(namesrv=self.namesrv, timeout_s=10)
        with Consumer(
            config=config, group="billing", topics=["orders", "payments"], max_messages=20,
            max_reconsume_times=1, consumer_id="billing-1",
        ) as consumer:  # fmt: skip
            started, done = time.monotonic(), 0
            while not self.stop.is_set():
                messages = consumer.poll(timeout_s=0.5)
                poison = [m for m in messages if m.tag == "poison"]
                if poison:
                    outcomes = consumer.nack(poison, delay_s=1, error="ValueError: card declined")
                    self.dead_letters += sum(o.action == "dlq" for o in outcomes)
                done += len(messages)
                ahead = done / BILLING_RATE - (time.monotonic() - started)
                if ahead > 0:
                    self.stop.wait(ahead)  # pacing: billing is the slow consumer
                consumer.commit()

    def archive(self) -> None:
        """Group ``archiver``: keeps up with ``audit``."""
        config = ClientConfig(namesrv=self.namesrv, timeout_s=10)
        with Consumer(
            config=config, group="archiver", topics=["audit"], consumer_id="archiver-1"
        ) as consumer:
            while not self.stop.is_set():
                consumer.poll(timeout_s=0.5)
                consumer.commit()


def leave_pending_work(namesrv: str, stack: ExitStack) -> None:
    """3 poison payments (for the DLQ), one delayed message, one open transaction."""
    config = ClientConfig(namesrv=namesrv, timeout_s=10)
    with Producer(config=config) as producer:
        producer.send_batch(
            "payments", [b'{"order": %d, "status": "declined"}' % (90001 + i) for i in range(3)],
            keys=[b"poison-%d" % i for i in range(3)], tags=["poison"] * 3,
        )  # fmt: skip
        producer.send_batch("payments", [b'{"reminder": "retry card"}'], delay_s=3600)
    holder = Producer(config=config)
    stack.callback(holder.close)
    txn = holder.transaction("import-2026-11-27", broker="a")
    txn.send_batch("audit", [b'{"import": "row %d"}' % i for i in range(25)])
    # Neither committed nor aborted: it stays open until the cluster stops.


# -- the console and the browser ------------------------------------------------------


def start_console(root: Path, namesrv: str, stack: ExitStack) -> ConsoleProcess:
    tokens = root / "console-users.toml"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    console = ConsoleProcess(
        root / "console", "--namesrv", namesrv, "--tokens-file", str(tokens),
        "--interval", "1s", "--history", "15m", *alarm_flags(root, stack),
    )  # fmt: skip
    stack.callback(lambda: console.process is not None and console.stop())
    console.start()
    return console


def take_shots(console: ConsoleProcess, out: Path) -> list[str]:
    """One PNG per page; the problems the browser logged, per page."""
    from tests.support.browser import browser_problems, login, open_chromium, wait_round

    problems: list[str] = []
    with open_chromium(window=(WIDTH, HEIGHT)) as driver:
        # A loaded 2-core machine (the cluster, its traffic and Chromium at
        # once) can take longer than browser.py's 30 s to render a page.
        driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
        login(driver, console.address, ADMIN_TOKEN)
        problems += [f"login: {p}" for p in browser_problems(driver)]
        for shot in SHOTS:
            fresh_tab(driver)
            started = time.monotonic()
            driver.get(console.address + shot.path)
            loaded_s = time.monotonic() - started
            # Two rounds after the one the console had: the page applied fresh
            # data, and its plots had a round to fetch their points.
            wait_round(driver, console.round() + 2, timeout_s=30)
            if shot.ready:
                wait_for(
                    f"{shot.path} to show its results",
                    lambda: driver.execute_script(f"return {shot.ready}"), 30,  # noqa: B023
                )  # fmt: skip
            if shot.scroll_to:
                driver.execute_script(SCROLL, shot.scroll_to)
            target = out / shot_file(shot)
            target.write_bytes(smaller_png(driver.get_screenshot_as_png()))
            problems += [f"{shot.path}: {p}" for p in browser_problems(driver)]
            size = target.stat().st_size // 1024
            print(f"console-shots: wrote {target} ({size} KiB; page loaded in {loaded_s:.1f}s)")
    return problems


SCROLL = """
const card = document.getElementById(arguments[0]);
window.scrollTo(0, card.getBoundingClientRect().top + window.scrollY - 76);
"""


def fresh_tab(driver: Chrome) -> None:
    """Go on in a new tab (same session cookie) and close the old one.

    Navigating within one tab puts each page in Chromium's back/forward
    cache with its event stream (/api/v1/events) still open; after six pages
    the six connections Chromium allows per host are all held, and the next
    page waits ~45 s for one. A closed tab holds none. The viewport is set
    per tab: 1280x800 itself (not the window), the PNGs' size."""
    old = driver.current_window_handle
    driver.switch_to.new_window("tab")
    new = driver.current_window_handle
    driver.switch_to.window(old)
    driver.close()
    driver.switch_to.window(new)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
    )


def smaller_png(data: bytes) -> bytes:
    """The same image with its pixel data deflated at level 9 (Chromium
    favours speed): typically a quarter smaller, no pixel changed."""
    at, pixels = 8, b""
    kept: list[bytes | None] = []
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        if kind == b"IDAT":
            pixels += body
            if kept and kept[-1] is not None:
                kept.append(None)  # where the image data goes
        else:
            kept.append(data[at : at + 12 + length])
        at += 12 + length
    idat = b"IDAT" + zlib.compress(zlib.decompress(pixels), 9)
    chunk = struct.pack(">I", len(idat) - 4) + idat + struct.pack(">I", zlib.crc32(idat))
    smaller = data[:8] + b"".join(chunk if part is None else part for part in kept)
    return smaller if len(smaller) < len(data) else data


# -- the run ------------------------------------------------------------------------


@contextmanager
def terminate_cleanly() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every started process is stopped."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(out: Path, seconds: float, workdir: Path) -> list[str]:
    with ExitStack() as stack:
        cluster = start_cluster(workdir / "cluster", stack)
        create_topics(cluster.namesrv)
        console = start_console(workdir, cluster.namesrv, stack)
        leave_pending_work(cluster.namesrv, stack)
        load = Load(cluster.namesrv)
        stack.callback(load.join)
        load.start()
        print(f"console-shots: {console.address}, traffic for {seconds:.0f}s", flush=True)
        load.stop.wait(seconds)  # the plots' history; ends early if a load thread failed
        if load.errors:
            raise RuntimeError("the demo traffic failed: " + "; ".join(load.errors))
        wait_for("3 dead letters of billing", lambda: load.dead_letters >= 3, 60)
        out.mkdir(parents=True, exist_ok=True)
        return take_shots(console, out)  # traffic goes on meanwhile: live pages
    raise AssertionError("unreachable")  # the with block returns or raises


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="console_shots", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("docs/images"), help="where the PNGs go")
    p.add_argument(
        "--seconds", type=float, default=75.0,
        help="traffic before the first shot, 10 to 600 (default 75)",
    )  # fmt: skip
    p.add_argument("--workdir", type=Path, help="keep the cluster's data and logs here")
    args = p.parse_args(argv)
    if not 10 <= args.seconds <= 600:
        p.error(f"--seconds {args.seconds:g}: give 10 to 600")
    with terminate_cleanly(), ExitStack() as stack:
        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="equeue-shots-"))
        )
        problems = run(args.out, args.seconds, workdir)
    for problem in problems:
        print(f"console-shots: browser problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
