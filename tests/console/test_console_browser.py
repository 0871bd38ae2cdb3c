"""The console's pages in a real Chromium against a real cluster (design30 5.3).

One cluster for the module: a name server, broker group ``a`` (master and a
replica) and ``b``; topics ``orders`` (2 queues on each group), ``work`` (on
``a``, with dead letters of group ``D``), ``staged`` (an open transaction) and
``later`` (a pending delayed message); group ``g`` has read part of
``orders``. The console polls it every second with users (``--tokens-file``)
and a lag alarm (``--alarm-lag 5 --alarm-for 1s``) that ``g`` sets off.
Each page's ``data-value`` cells are compared with what the client's ``Admin``
says; the plots gain points without a reload; the browser log has no script
error and no CSP violation; an admin resets ``g`` through the form; a
``monitor`` session sees no admin button; a SIGKILLed group shows
``unreachable``.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_spark.client import Admin, ClientConfig, Consumer, Producer
from tests.support.browser import browser_problems, login, open_chromium, wait_round
from tests.support.observability import ConsoleProcess
from tests.support.waits import wait_for, wait_routed

pytestmark = [pytest.mark.slow]

ADMIN, MONITOR = "browser-admin-secret-0123", "browser-monitor-secret-01"
TOKENS = f"""
[[tokens]]
name = "ops"
secret = "{ADMIN}"
roles = ["admin"]

[[tokens]]
name = "dashboards"
secret = "{MONITOR}"
roles = ["monitor"]
"""
SHOTS = Path("/tmp/d30-shots")
ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "raw", "type": "bytes"}],
}
ALARM_LAG = 5
"""--alarm-lag: group g's lag on orders (30 or more) is over it, so flag-lag fires."""
BINARY = b"\xff\xfe\x00binary\x80"
"""A value that is not UTF-8: the message browser shows it as a hex dump."""


@dataclass
class Scene:
    cluster: LocalCluster
    replica: BrokerProcess
    console: ConsoleProcess

    def admin(self) -> Admin:
        return Admin(config=ClientConfig(namesrv=self.cluster.namesrv, timeout_s=5))

    def producer(self) -> Producer:
        return Producer(config=ClientConfig(namesrv=self.cluster.namesrv, timeout_s=5))


def fill(scene_namesrv: str) -> None:
    """Topics, a partly read group, dead letters, an open transaction and a
    pending delayed message."""
    config = ClientConfig(namesrv=scene_namesrv, timeout_s=5)
    with Admin(config=config) as admin:
        admin.create_topic("orders", queues=2)
        for name in ("work", "staged", "later", "bin", "avro"):
            admin.create_topic(name, queues=1, brokers=["a"])
        for name, queues in (("orders", 4), ("avro", 1)):
            wait_routed(admin, name, queues)
        admin.set_schema("avro", ORDER)
    encoded = io.BytesIO()
    fastavro.schemaless_writer(encoded, fastavro.parse_schema(ORDER), {"id": 7, "raw": b"\x00\x01"})
    with Producer(config=config, validate=True) as producer:
        producer.send_batch("avro", [encoded.getvalue()], queue_ids=[0], brokers=["a"])
    with Producer(config=config) as producer:
        producer.send_batch("orders", [b"order-%d" % i for i in range(40)], keys=[b"k"] * 40)
        producer.send_batch("work", [b"a", b"b"], queue_ids=[0, 0], brokers=["a", "a"])
        producer.send_batch("bin", [BINARY], queue_ids=[0], brokers=["a"])
        producer.send_batch("later", [b"d"], queue_ids=[0], brokers=["a"], delay_s=600)
        producer.send_batch(
            "staged", [b"s1", b"s2"], queue_ids=[0, 0], brokers=["a", "a"], transaction_id="tx-1"
        )
    with Consumer(config=config, group="g", topics=["orders"], max_messages=10) as consumer:
        seen = 0

        def read_some() -> bool | None:
            nonlocal seen
            seen += len(consumer.poll(timeout_s=0.5))
            consumer.commit()
            return seen >= 10 or None

        wait_for("group g reading orders", read_some, 30)
    with Consumer(config=config, group="D", topics=["work"], max_reconsume_times=1) as consumer:
        dead: list[str] = []

        def nacked() -> bool | None:
            for message in consumer.poll(timeout_s=0.5):
                (outcome,) = consumer.nack(message, delay_s=0.1, error="bad")
                if outcome.action == "dlq":
                    dead.append(message.message_id)
            consumer.commit()
            return len(dead) >= 2 or None

        wait_for("two dead letters", nacked, 30)


@contextmanager
def running_scene(root: Path, interval: str = "1s") -> Iterator[Scene]:
    tokens = root / "tokens.toml"
    root.mkdir(parents=True, exist_ok=True)
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    cluster = LocalCluster(root / "cluster")
    replica: BrokerProcess | None = None
    console: ConsoleProcess | None = None
    try:
        cluster.start(namesrvs=1, brokers=("a", "b"))
        replica = BrokerProcess(
            root / "cluster" / "broker-a-replica", "--broker-name", "a", "--namesrv",
            cluster.namesrv, "--role", "replica", "--master", cluster.brokers["a"].address,
        )  # fmt: skip
        replica.start()
        fill(cluster.namesrv)
        console = ConsoleProcess(
            root / "console", "--namesrv", cluster.namesrv, "--tokens-file", str(tokens),
            "--interval", interval, "--alarm-lag", str(ALARM_LAG), "--alarm-for", "1s",
            reader=ADMIN,
        )  # fmt: skip
        console.start()
        yield Scene(cluster, replica, console)
    finally:
        if console is not None:
            console.stop()
        if replica is not None and replica.alive():
            replica.stop()
        cluster.stop()


def leave(driver: WebDriver) -> None:
    """Leave a page of a console the test is about to stop: the page's event
    stream reconnects to a console that is gone, and Chromium logs each
    refused attempt as an error (seen once on a loaded machine)."""
    driver.get("about:blank")


# -- fixtures: one cluster, one console, one Chromium for the module --------------------


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    with running_scene(tmp_path_factory.mktemp("console-browser")) as started:
        yield started


@pytest.fixture(scope="module")
def driver(scene: Scene) -> Iterator[WebDriver]:
    with open_chromium((1280, 900)) as opened:
        assert login(opened, scene.console.address, ADMIN) == "ops"
        yield opened


@pytest.fixture(autouse=True)
def no_browser_problems(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test ends with an empty browser log: no script error, no CSP report."""
    yield
    if "driver" in request.fixturenames:
        assert browser_problems(request.getfixturevalue("driver")) == []


# -- reading the page ----------------------------------------------------------------------


def visit(driver: WebDriver, scene: Scene, path: str, shot: str = "") -> None:
    driver.get(scene.console.address + path)
    # Round 2 at least: rates and plots need two rounds.
    wait_round(driver, 2, 30)
    if shot:
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / f"test-{shot}.png"))


def cells(driver: WebDriver, table: str, testid: str) -> dict[str, str]:
    """{row key: data-value} of one column of a table."""
    found: dict[str, str] = driver.execute_script(
        "const out = {};"
        "for (const td of document.querySelectorAll("
        "  '#' + arguments[0] + ' tbody tr[data-key] [data-testid=\"' + arguments[1] + '\"]')) {"
        "  out[td.closest('tr').dataset.key] = td.dataset.value; }"
        "return out;",
        table, testid,
    )  # fmt: skip
    return found


def stat(driver: WebDriver, testid: str) -> str:
    value: str = driver.execute_script(
        "const e = document.querySelector('.stat [data-testid=\"' + arguments[0] + '\"]');"
        "return e ? e.dataset.value : null;",
        testid,
    )
    return value


def chart_points(driver: WebDriver, name: str) -> int:
    points: int = driver.execute_script(
        "const c = (window.equeueCharts || {})[arguments[0]];return c ? c.data[0].length : -1;",
        name,
    )
    return points


def visible(driver: WebDriver, selector: str) -> bool:
    shown: bool = driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "return Boolean(e && e.offsetParent !== null);",
        selector,
    )
    return shown


def wait_dom(driver: WebDriver, what: str, script: str, *args: Any, timeout_s: float = 15) -> Any:
    return wait_for(what, lambda: driver.execute_script(script, *args), timeout_s)


# -- the pages ---------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_cluster_page_shows_members_roles_and_replicas(driver: WebDriver, scene: Scene) -> None:
    visit(driver, scene, "/", "cluster")
    with scene.admin() as admin:
        members = admin.cluster_stats()
    roles = {m.entry.address: m.entry.role for m in members}
    assert cells(driver, "members", "role") == roles
    # Every member answers ("suspect": its registration was late on a loaded
    # machine, as the name servers see it, but it answered GetStats).
    assert set(cells(driver, "members", "state").values()) <= {"live", "suspect"}
    assert all(v != "" for v in cells(driver, "members", "disk-used").values())
    assert cells(driver, "members", "broker") == {
        m.entry.address: m.entry.broker_name for m in members
    }
    assert cells(driver, "replicas", "address") == {scene.replica.address: scene.replica.address}
    assert cells(driver, "replicas", "in-sync") == {scene.replica.address: "true"}
    assert cells(driver, "namesrvs", "state") == {scene.cluster.namesrv: "up"}
    wait_for(
        "two points on each cluster plot",
        lambda: min(chart_points(driver, "cluster_rate"), chart_points(driver, "replica_lag")) >= 2,
        15,
    )


@pytest.mark.timeout(240)
def test_topic_pages_show_the_clients_sizes(driver: WebDriver, scene: Scene) -> None:
    visit(driver, scene, "/topics", "topics")
    with scene.admin() as admin:
        topics = {t.name: t for t in admin.list_topics() if not t.name.startswith("%")}
        orders = admin.describe_topic("orders")
    assert cells(driver, "topics", "queues") == {n: str(len(t.queues)) for n, t in topics.items()}
    assert cells(driver, "topics", "stored") == {
        n: str(sum(q.end_offset - q.earliest_offset for q in t.queues)) for n, t in topics.items()
    }
    assert cells(driver, "topics", "delayed")["later"] == "1"
    assert chart_points(driver, "topics_in") >= 2

    visit(driver, scene, "/topics/orders", "topic")
    assert cells(driver, "queues", "end") == {
        f"{q.broker}/{q.queue_id}": str(q.end_offset) for q in orders.queues
    }
    with scene.admin() as admin:
        g = admin.describe_group("g")
    assert cells(driver, "readers", "lag") == {"g": str(g.total_lag)}
    assert chart_points(driver, "topic_rate") >= 2
    assert visible(driver, "#add-queues-submit")  # an admin session


@pytest.mark.timeout(240)
def test_group_pages_show_lag_per_queue_and_dead_letters(driver: WebDriver, scene: Scene) -> None:
    visit(driver, scene, "/groups", "groups")
    with scene.admin() as admin:
        g = admin.describe_group("g")
        dead = admin.dead_letters("D")
    assert cells(driver, "groups", "lag")["g"] == str(g.total_lag)
    assert cells(driver, "groups", "dlq")["D"] == str(len(dead)) == "2"
    assert cells(driver, "groups", "retry")["D"] == "2"

    visit(driver, scene, "/groups/D", "group-dlq")
    wait_dom(
        driver,
        "the dead letters listed",
        "return document.querySelectorAll('#dlq tbody tr[data-key]').length === 2",
    )
    assert set(cells(driver, "dlq", "id")) == {m.message_id for m in dead}
    assert (
        driver.execute_script(
            "return getComputedStyle(document.querySelector('#dlq [data-testid=id]')).whiteSpace"
        )
        == "nowrap"
    )
    # The reset form opens on the group's own topic, not on %RETRY%D.
    assert Select(driver.find_element(By.ID, "reset-topic")).first_selected_option.text == "work"
    assert visible(driver, "#dlq-resend") and visible(driver, "#dlq-purge")

    visit(driver, scene, "/groups/g", "group")
    assert cells(driver, "group-queues", "lag") == {
        f"{q.broker}/{q.topic}/{q.queue_id}": str(q.lag) for q in g.queues
    }
    assert stat(driver, "lag") == str(g.total_lag)
    wait_for("the lag plot", lambda: chart_points(driver, "group_lag") >= 2, 15)


@pytest.mark.timeout(240)
def test_figures_and_plots_follow_the_rounds_without_a_reload(
    driver: WebDriver, scene: Scene
) -> None:
    visit(driver, scene, "/groups/g")
    driver.execute_script("window.__sameDocument = true;")
    before = int(stat(driver, "lag"))
    points = chart_points(driver, "group_lag")
    with scene.producer() as producer:
        producer.send_batch("orders", [b"live-%d" % i for i in range(7)])
    wait_for("the lag cell to grow by 7", lambda: stat(driver, "lag") == str(before + 7), 20)
    wait_for("the plot to gain points", lambda: chart_points(driver, "group_lag") > points, 20)
    assert driver.execute_script("return window.__sameDocument === true")
    with scene.admin() as admin:
        assert admin.describe_group("g").total_lag == before + 7


@pytest.mark.timeout(240)
def test_transactions_and_messages_pages(driver: WebDriver, scene: Scene) -> None:
    visit(driver, scene, "/transactions", "transactions")
    with scene.admin() as admin:
        open_txns = admin.broker_admin("a").list_transactions().transactions
        first = admin.get_message_at("orders", 0, 0, broker="a")
    assert stat(driver, "txn-count") == str(len(open_txns)) == "1"
    assert cells(driver, "transactions", "messages") == {"a/tx-1": "2"}
    assert cells(driver, "delayed", "pending") == {"later": "1"}

    visit(driver, scene, "/messages?topic=orders&broker=a&queue=0&offset=0&count=3", "messages")
    wait_dom(
        driver,
        "three messages",
        "return document.querySelectorAll('#msg-results .message').length === 3",
    )
    ids = driver.execute_script(
        "return Array.from(document.querySelectorAll('#msg-results .message'))"
        "  .map(m => m.dataset.id)"
    )
    assert ids[0] == first.message_id
    shown = driver.find_element(By.CSS_SELECTOR, "#msg-results .message [data-testid=value]")
    assert shown.text == first.value.decode()

    visit(driver, scene, "/messages?topic=bin&broker=a&queue=0&offset=0")
    wait_dom(driver, "the binary message", "return document.querySelector('#msg-results .message')")
    dump = driver.find_element(By.CSS_SELECTOR, "#msg-results [data-testid=value]")
    assert dump.get_attribute("data-encoding") == "hex"
    assert dump.text.startswith("00000000  ff fe 00 62")

    visit(driver, scene, "/messages?topic=avro&broker=a&queue=0&offset=0", "messages-decoded")
    wait_dom(driver, "the Avro message", "return document.querySelector('#msg-results .message')")
    decoded = driver.find_element(By.CSS_SELECTOR, "#msg-results [data-testid=decoded]")
    assert json.loads(decoded.text) == {"id": 7, "raw": "AAE="}
    # The broker group is a menu of the cluster's groups, "any" first.
    wait_dom(
        driver, "the broker groups in the menu",
        "return document.querySelectorAll('#msg-broker option').length === 3",
    )  # fmt: skip
    menu = Select(driver.find_element(By.ID, "msg-broker"))
    assert [o.get_attribute("value") for o in menu.options] == ["", "a", "b"]
    assert menu.first_selected_option.get_attribute("value") == "a"


def alarm_cells(driver: WebDriver, key: str) -> dict[str, str]:
    """{testid: data-value} of the alarms table's row ``key``."""
    found: dict[str, str] = driver.execute_script(
        "const tr = Array.from(document.querySelectorAll('#alarms tbody tr[data-key]'))"
        "  .find(r => r.dataset.key === arguments[0]);"
        "if (!tr) return {};"
        "const out = {};"
        "for (const td of tr.querySelectorAll('[data-testid]'))"
        "  out[td.dataset.testid] = td.dataset.value;"
        "return out;",
        key,
    )  # fmt: skip
    return found


@pytest.mark.timeout(240)
def test_the_alarms_page_shows_a_firing_lag_alarm_as_the_api_has_it(
    driver: WebDriver, scene: Scene
) -> None:
    labels = {"group": "g", "topic": "orders"}
    key = "flag-lag " + json.dumps(labels, separators=(",", ":"))
    visit(driver, scene, "/alarms", "alarms")
    wait_dom(
        driver, "g's lag alarm firing",
        "return Array.from(document.querySelectorAll('#alarms tbody tr[data-key]'))"
        "  .some(r => r.dataset.key === arguments[0]"
        "    && r.querySelector('[data-testid=state]').dataset.value === 'firing');",
        key, timeout_s=30,
    )  # fmt: skip

    def same_as_the_api() -> dict[str, Any] | None:
        status, body, _ = scene.console.get("/api/v1/alarms")
        assert status == 200 and body["available"] is True
        (alarm,) = [a for a in body["active"] if a["alarm"] == "flag-lag" and a["labels"] == labels]
        shown = alarm_cells(driver, key)
        return alarm if shown.get("value") == f"{alarm['value']:g}" else None

    alarm = wait_for("the page to show the API's value", same_as_the_api, 20)
    shown = alarm_cells(driver, key)
    assert alarm["state"] == "firing" and alarm["since_ms"] > 0
    assert shown["since"] == str(alarm["since_ms"])
    assert shown["notified"] == str(alarm["notified_ms"])
    assert json.loads(shown["labels"]) == labels
    assert float(shown["threshold"]) == alarm["threshold"] == ALARM_LAG
    with scene.admin() as admin:
        lag = sum(q.lag for q in admin.describe_group("g").queues if q.topic == "orders")
    assert float(shown["value"]) == alarm["value"] == lag
    since = driver.find_element(
        By.CSS_SELECTOR, "#alarms tbody tr.alarm-firing [data-testid=since]"
    ).text
    assert since.endswith(" UTC") and since[:4].isdigit()
    assert cells(driver, "rules", "for")["flag-lag"] == "1"
    for_text = driver.find_element(By.CSS_SELECTOR, "#rules [data-testid=for]").text
    assert for_text == "1s"
    # The alarm's plot: g's lag on orders and the threshold, a constant line.
    plot = "alarm:flag-lag:g/orders:messages:5"
    wait_for("the lag alarm's plot", lambda: chart_points(driver, plot) >= 2, 20)
    threshold = driver.execute_script(
        "const d = window.equeueCharts[arguments[0]].data; return d[d.length - 1];", plot
    )
    assert set(threshold) == {ALARM_LAG}


@pytest.mark.timeout(240)
def test_an_admin_resets_a_group_and_adds_a_queue_through_the_forms(
    driver: WebDriver, scene: Scene
) -> None:
    visit(driver, scene, "/groups/g")
    Select(driver.find_element(By.ID, "reset-topic")).select_by_value("orders")
    Select(driver.find_element(By.ID, "reset-to")).select_by_value("earliest")
    button = driver.find_element(By.ID, "reset-submit")
    button.click()  # arms it
    assert "Click again" in button.text
    button.click()
    wait_dom(
        driver,
        "the reset reported",
        "return document.getElementById('reset-result').dataset.state === 'ok'",
    )
    with scene.admin() as admin:
        g = admin.describe_group("g")
        orders = admin.describe_topic("orders")
    assert {q.committed_offset for q in g.queues} == {0}
    assert g.total_lag == sum(q.end_offset for q in orders.queues)
    wait_for("the page to show the new lag", lambda: stat(driver, "lag") == str(g.total_lag), 20)

    visit(driver, scene, "/topics/staged")
    driver.find_element(By.ID, "add-queues-submit").click()
    wait_dom(
        driver,
        "the queue added",
        "return document.getElementById('add-queues-result').dataset.state === 'ok'",
    )
    with scene.admin() as admin:
        assert len(admin.describe_topic("staged").queues) == 2


@pytest.mark.timeout(240)
def test_a_monitor_session_sees_no_admin_buttons(driver: WebDriver, scene: Scene) -> None:
    visit(driver, scene, "/")
    driver.find_element(By.ID, "logout").click()
    wait_dom(driver, "the login form", "return document.getElementById('login-token')")
    driver.get(scene.console.address + "/groups")  # logged out: sent to log in
    wait_dom(driver, "sent to /login", "return location.pathname === '/login'")
    try:
        assert login(driver, scene.console.address, MONITOR) == "dashboards"
        for path in ("/groups/g", "/groups/D", "/topics/orders"):
            visit(driver, scene, path)
            for selector in ("#reset-submit", "#add-queues-submit", "#dlq-resend", "#dlq-purge"):
                assert not visible(driver, selector), f"{selector} shown to a monitor on {path}"
        assert driver.find_element(By.ID, "whoami").get_attribute("data-admin") == "false"
    finally:
        driver.delete_all_cookies()
        login(driver, scene.console.address, ADMIN)


@pytest.mark.timeout(240)
def test_a_page_for_a_missing_topic_says_so(driver: WebDriver, scene: Scene) -> None:
    visit(driver, scene, "/topics/no-such-topic")
    banner = driver.find_element(By.ID, "banner")
    assert "no-such-topic" in banner.text and "not in the last poll round" in banner.text


@pytest.mark.timeout(240)
def test_a_console_without_users_is_read_only(
    driver: WebDriver, scene: Scene, tmp_path: Path
) -> None:
    console = ConsoleProcess(
        tmp_path / "console", "--namesrv", scene.cluster.namesrv, "--interval", "1s"
    )
    console.start()
    try:
        driver.get(console.address + "/groups/D")
        wait_round(driver, 2, 30)
        wait_dom(
            driver, "the dead letters", "return document.querySelector('#dlq tbody tr[data-key]')"
        )
        for selector in ("#reset-submit", "#dlq-resend", "#dlq-purge"):
            assert not visible(driver, selector), f"{selector} on a read-only console"
        assert "read-only" in driver.find_element(By.ID, "whoami").text
        assert cells(driver, "group-queues", "lag") != {}
    finally:
        leave(driver)  # before the stop: the page's event stream would retry, and log it
        console.stop()


@pytest.mark.timeout(240)
def test_an_age_lag_alarm_is_shown_and_plotted_in_seconds(
    driver: WebDriver, scene: Scene, tmp_path: Path
) -> None:
    """``--alarm-lag-seconds``: the value and threshold are ages (the API's
    unit says messages for every group_lag rule), and the plot is of the
    group_lag_seconds series."""
    console = ConsoleProcess(
        tmp_path / "console", "--namesrv", scene.cluster.namesrv, "--interval", "1s",
        "--alarm-lag-seconds", "1", "--alarm-for", "1s",
    )  # fmt: skip
    console.start()
    try:
        driver.get(console.address + "/alarms")
        wait_round(driver, 2, 30)
        plot = "alarm:flag-lag:g/orders:seconds:1"
        wait_for("the age alarm's plot", lambda: chart_points(driver, plot) >= 2, 30)
        key = "flag-lag " + json.dumps({"group": "g", "topic": "orders"}, separators=(",", ":"))
        shown = alarm_cells(driver, key)
        assert shown["threshold"] == "1" and float(shown["value"]) > 1
        texts = driver.execute_script(
            "const tr = Array.from(document.querySelectorAll('#alarms tbody tr[data-key]'))"
            "  .find(r => r.dataset.key === arguments[0]);"
            "return ['value', 'threshold'].map("
            "  t => tr.querySelector('[data-testid=' + t + ']').textContent);",
            key,
        )  # fmt: skip
        assert texts[1] == "1.0 s" and (texts[0].endswith(" s")), texts
    finally:
        leave(driver)  # before the stop: the page's event stream would retry, and log it
        console.stop()


@pytest.mark.timeout(240)
def test_a_killed_broker_shows_unreachable_and_pages_keep_working(
    driver: WebDriver, scene: Scene
) -> None:
    visit(driver, scene, "/")
    b = scene.cluster.brokers["b"]
    b.kill()
    killed_at = time.monotonic()
    state = wait_dom(
        driver, "b shown as not answering",
        "const s = Array.from(document.querySelectorAll("
        "  '#members tr[data-broker=\"b\"] [data-testid=state]'))"
        "  .map(td => td.dataset.value).filter(v => v === 'unreachable' || v === 'down');"
        "return s[0] || null;",
        timeout_s=10,
    )  # fmt: skip
    assert state in ("unreachable", "down"), time.monotonic() - killed_at
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / "test-cluster-killed.png"))
    visit(driver, scene, "/topics", "topics-partial")
    wait_dom(
        driver,
        "the topics page says partial",
        "return document.getElementById('banner').textContent.includes('partial')",
        timeout_s=15,
    )
    visit(driver, scene, "/groups")
    assert "g" in cells(driver, "groups", "lag")
