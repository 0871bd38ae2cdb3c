"""The broker's settings: docs/equeue-broker.toml, flags, units and defaults.

The sample config file is loaded through the real parser and must name every
setting with its unit and default, so it cannot fall behind the broker. The
flag and key names are a documented interface (users, an external test suite):
they are pinned here.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from equeue_broker.server.config import (
    BY_KEY,
    DEFAULT_DATA_DIR,
    SETTINGS,
    BrokerConfig,
    Setting,
    parse_args,
)
from equeue_broker.storage.config import FlushMode, StorageConfig

SAMPLE = Path(__file__).resolve().parents[2] / "docs" / "equeue-broker.toml"
ASSIGNMENT = re.compile(r"^(# )?([a-z][a-z0-9_-]*) = (.+)$")

FLAGS = [
    "--data-dir", "--host", "--port", "--flush", "--flush-interval-ms", "--chunk-size",
    "--max-message-bytes", "--retention-max-chunks", "--retention-max-age-hours",
    "--retention-keep-unconsumed", "--retention-check-interval-ms", "--auto-create-topics",
    "--default-queues", "--max-wait-ms", "--max-parked-pulls", "--consumer-timeout-ms",
    "--transaction-timeout-ms", "--max-connections-per-address", "--max-open-transactions",
    "--txn-check-after", "--txn-check-interval", "--txn-check-max", "--txn-check-exhausted",
    "--max-check-streams", "--key-index", "--key-index-slots", "--key-index-capacity",
    "--key-index-window",
    "--max-transaction-bytes",
    "--tls-cert", "--tls-key", "--tls-client-ca", "--tokens-file", "--fetch-port",
    "--fetch-insecure", "--http-port", "--http-host", "--log-level", "--log-format",
    "--library-log-level", "--namesrv", "--namesrv-tls-ca", "--namesrv-tls-cert",
    "--namesrv-tls-key", "--namesrv-token-file", "--broker-name", "--cluster",
    "--advertise-address", "--register-interval-ms", "--role", "--master", "--max-replicas",
    "--zookeeper",
    "--zk-session-timeout-ms", "--zk-fast-failover", "--replication", "--min-insync-replicas",
    "--replica-lag-max-ms",
    "--max-delay", "--max-reconsume-times",
]  # fmt: skip
FILE_ONLY = [
    "max_queues_per_topic", "max_pull_messages", "max_pull_bytes", "max_request_bytes",
    "max_consumer_groups", "max_consumers", "max_consumers_per_group", "max_heartbeat_topics",
    "max_queue_locks", "max_pull_streams", "max_reply_bytes", "max_produce_bytes",
    "max_produce_streams", "max_intake_bytes", "request_read_timeout_ms",
    "max_open_index_files", "max_schema_bytes", "max_schema_versions", "max_connections",
    "max_streams_per_connection",
    "max_connection_idle_ms", "handshake_timeout_ms", "stream_send_timeout_ms", "budget_wait_ms",
    "max_key_scan", "max_producers", "producer_window", "max_queues_per_producer",
    "producer_idle_expiry_ms",
    "store_threads", "metrics_max_topics", "metrics_max_groups", "metrics_max_series",
    "shutdown_grace_s", "max_replication_waits", "retry_backoff",
    "retry_backoff_groups",
]  # fmt: skip


def documented() -> dict[str, tuple[bool, str]]:
    """Setting key (underscores) -> (set in the file, the comment block above it).

    A setting is named by ``key = value`` or, left at its default, by
    ``# key = value``; its comment block is the ``#`` lines right above it.
    """
    found: dict[str, tuple[bool, str]] = {}
    block: list[str] = []
    for line in SAMPLE.read_text().splitlines():
        match = ASSIGNMENT.match(line)
        if match and match[2].replace("-", "_") in BY_KEY:
            key = match[2].replace("-", "_")
            assert key not in found, f"{key} appears twice"
            found[key] = (match[1] is None, " ".join(block))
            block = []
        elif line.startswith("#"):
            block.append(line.lstrip("# "))
        else:
            block = []
    return found


def test_sample_config_parses_through_the_real_parser() -> None:
    config = parse_args(["--config", str(SAMPLE)])
    document = tomllib.loads(SAMPLE.read_text())
    assert document, "the sample sets nothing"
    for key, value in document.items():
        parsed = config.setting(key.replace("-", "_"))
        assert (str(parsed) if isinstance(parsed, Path) else parsed) == value, key
    assert config.storage.data_dir == Path("/var/lib/equeue")


def test_sample_config_names_every_setting() -> None:
    names = set(documented())
    assert names == set(BY_KEY), (
        f"missing from docs/equeue-broker.toml: {sorted(set(BY_KEY) - names)}"
    )
    server = {f.name for f in fields(BrokerConfig)} - {"storage", "origins"}
    assert server <= names


def test_sample_config_states_each_unit_and_default() -> None:
    for key, (_, comment) in documented().items():
        setting = BY_KEY[key]
        assert f"Default: {setting.describe_default()}." in comment, key
        if setting.unit_name():
            assert f"Unit: {setting.unit_name()}." in comment, key
        else:
            assert "Unit:" not in comment, key


def test_commented_out_settings_parse_when_uncommented(tmp_path: Path) -> None:
    text = SAMPLE.read_text()
    commented = {k for k, (active, _) in documented().items() if not active}
    assert commented == {
        "tls_cert", "tls_key", "tls_client_ca", "tokens_file", "http_port",
        "namesrv_tls_ca", "namesrv_tls_cert", "namesrv_tls_key", "namesrv_token_file",
    }  # fmt: skip
    uncommented = tmp_path / "broker.toml"
    uncommented.write_text(re.sub(r"^# ([a-z-]+ = )", r"\1", text, flags=re.M))
    config = parse_args(["--config", str(uncommented)])
    assert config.tls_cert == Path("/etc/equeue/tls/broker.crt")
    assert config.tokens_file == Path("/etc/equeue/tokens.toml")
    assert config.http_port == 9100
    assert config.namesrv_tls_ca == Path("/etc/equeue/tls/ca.crt")
    assert config.namesrv_token_file == Path("/etc/equeue/namesrv-token")


def test_flags_and_keys_are_unchanged() -> None:
    assert [s.flag_name for s in SETTINGS if s.flag] == FLAGS
    assert [s.key for s in SETTINGS if not s.flag] == FILE_ONLY
    assert {f[2:].replace("-", "_") for f in FLAGS} | set(FILE_ONLY) == set(BY_KEY)


def test_storage_defaults_come_from_storage_config() -> None:
    assert BrokerConfig().storage == StorageConfig(DEFAULT_DATA_DIR)
    default = StorageConfig(DEFAULT_DATA_DIR)
    assert BY_KEY["chunk_size"].default() == default.chunk_capacity_bytes
    assert BY_KEY["max_pull_bytes"].default() == default.max_read_bytes
    assert default.retention.max_age_ms is not None
    assert BY_KEY["retention_max_age_hours"].default() == default.retention.max_age_ms / 3_600_000
    assert BY_KEY["flush"].default() == default.flush_mode.value


def test_units_convert_both_ways(tmp_path: Path) -> None:
    config = parse_args(["--retention-max-age-hours", "0.5", "--flush", "sync"])
    assert config.storage.retention.max_age_ms == 1_800_000
    assert config.setting("retention_max_age_hours") == 0.5
    assert config.storage.flush_mode is FlushMode.SYNC
    unlimited = parse_args(["--retention-max-age-hours", "-1"])
    assert unlimited.storage.retention.max_age_ms is None
    assert unlimited.setting("retention_max_age_hours") == -1
    config_file = tmp_path / "broker.toml"
    config_file.write_text("max_pull_messages = 50\nmax-transaction-bytes = 4096\n")
    config = parse_args(["--config", str(config_file)])
    assert config.storage.max_read_messages == 50
    assert config.storage.transactions.max_bytes == 4096


STORAGE_NAMES = {name for s in SETTINGS if s.target for name in (s.target, s.path[-1])}
"""The ``StorageConfig`` fields settings set: names no operator gave."""
CHECKED = [s for s in SETTINGS if s.target and s.kind() in (int, float) and not s.duration]


@pytest.mark.parametrize("setting", CHECKED, ids=[s.key for s in CHECKED])
def test_storage_errors_name_the_setting_as_given(
    setting: Setting, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every setting that sets a storage field (issue 26, item 10): a bad value
    given by flag is named by the flag, one in the config file by its key and
    the file; never by the storage field's internal name (``--chunk-size -5``
    answered ``chunk_capacity_bytes must be ...``); the value as given."""
    if setting.flag:
        argv, shown = [setting.flag_name, "-5"], setting.flag_name
    else:
        config_file = tmp_path / "broker.toml"
        config_file.write_text(f"{setting.key} = -5\n")
        argv, shown = ["--config", str(config_file)], f"{setting.key} in {config_file}"
    with pytest.raises(SystemExit):
        parse_args(argv)
    error = capsys.readouterr().err
    assert error.startswith(f"equeue-broker: error: {shown} must be "), error
    assert error.count("\n") == 1 and ", got -5 " in error, error
    internal = {n for n in STORAGE_NAMES - {setting.key} if re.search(rf"\b{n}\b", error)}
    assert not internal, error


@pytest.mark.parametrize(
    ("file", "flags", "said"),
    [
        ("", ["--max-delay", "400d"], "--max-delay '400d' is out of range: give more than 0 "
         "and at most 366d"),
        ("", ["--max-delay", "7 days"], "--max-delay '7 days' is not a duration like 500ms, "
         "30s, 15m, 2h or 7d"),
        ("", ["--max-reconsume-times", "-1"], "--max-reconsume-times must be in [0, 10000], "
         "got -1"),
        ('retry-backoff = "1m"', [], 'retry_backoff = "1m": expected a list of durations'),
        ('retry-backoff = ["1m", "soon"]', [], "retry_backoff in {file}: entry 'soon' is not a "
         "duration"),
        ('retry-backoff = ["1m", "2d"]', ["--max-delay", "1d"], "retry_backoff in {file} step 2d"
         " must be more than 0 and at most the longest delay, 1d (--max-delay)"),
        ("retry-backoff = []", [], "retry_backoff in {file} has 0 steps; give 1 to 64"),
        ('retry-backoff-groups = {billing = "1s"}', [], "expected a table of groups and "
         "durations"),
        ('retry-backoff-groups = {"%x" = ["1s"]}', [], "retry_backoff_groups in {file}: group "
         "'%x': group name '%x' is reserved"),
        ('retry-backoff-groups = {billing = ["1s", "9d"]}', [], "retry_backoff_groups in {file}:"
         " group 'billing' step 9d must be more than 0 and at most the longest delay, 7d"),
    ],
)  # fmt: skip
def test_delay_and_retry_settings_say_what_is_wrong(
    file: str, flags: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "broker.toml"
    config_file.write_text(file + "\n")
    with pytest.raises(SystemExit):
        parse_args(["--config", str(config_file), *flags])
    error = capsys.readouterr().err
    assert said.format(file=config_file) in error, error
    assert error.count("\n") == 1, error


def test_delay_and_retry_settings_reach_their_targets() -> None:
    config = parse_args(["--max-delay", "30d", "--max-reconsume-times", "3"])
    assert config.storage.timer.max_delay_ms == 30 * 86_400_000
    assert (config.setting("max_delay"), config.max_reconsume_times) == ("30d", 3)
    assert config.retry_backoff[:3] == (10_000, 30_000, 60_000)
    assert config.setting("retry_backoff")[-1] == "2h"
    assert config.retry_backoff_groups == {}
    config = BrokerConfig.from_settings({"retry_backoff_groups": {"billing": ["1s", "1m"]}})
    assert config.retry_backoff_groups == {"billing": (1_000, 60_000)}
    assert config.setting("retry_backoff_groups") == {"billing": ["1s", "1m"]}


def test_a_short_max_delay_cuts_the_default_back_off_steps() -> None:
    """The documented ``--max-delay 15m`` starts: the default steps (up to 2 h)
    are cut to it; steps an operator gives must fit it (refused above)."""
    config = parse_args(["--max-delay", "15m"])
    steps = config.backoff_steps()
    assert steps[:3] == (10_000, 30_000, 60_000)
    assert max(steps) == 15 * 60_000 == steps[-1]
    assert parse_args([]).backoff_steps() == parse_args([]).retry_backoff


def test_a_storage_error_names_every_setting_it_is_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "broker.toml"
    config_file.write_text("chunk_size = 65536\n")
    with pytest.raises(SystemExit):
        parse_args(["--config", str(config_file), "--max-message-bytes", "131072"])
    assert capsys.readouterr().err.startswith(
        f"equeue-broker: error: --max-message-bytes (131072) must not exceed chunk_size in"
        f" {config_file} (65536): records never span chunks"
    )


def test_help_shows_each_default_and_unit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for setting in SETTINGS:
        assert f"({setting.unit_and_default()})" in text, setting.key


def test_help_explains_the_data_dir(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    options = text[text.index("options:") :]  # past the usage line
    described = options[options.index("--data-dir DATA_DIR") : options.index("--host HOST")]
    assert "message log" in described and "consumer offsets" in described
    assert "created if missing" in described
    assert "relative path is taken from the working directory" in described
    assert "(default equeue-data)" in described
