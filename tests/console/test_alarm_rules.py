"""Alarm rules from the TOML file and the --alarm-* flags (pure: no process)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from equeue_spark.console.alarms.rules import (
    DEFAULT_TOTAL,
    RuleError,
    add_arguments,
    from_args,
    load_file,
    parse_duration,
)

FULL = """
[defaults]
for = "30s"
resolve_for = "30s"
hysteresis = 0.1
repeat = "1h"
notify = ["ops", "ops-mail"]

[[notifier]]
name = "ops"
type = "webhook"
url = "https://hooks.example.com/equeue"
headers = { Authorization = "Bearer ${HOOK_TOKEN}" }
timeout = "5s"

[[notifier]]
name = "ops-mail"
type = "email"
to = ["ops@example.com", "oncall@example.com"]
from = "equeue@example.com"
smtp = "smtp.example.com:587"
tls = "starttls"
username = "alarm"
password_file = "/etc/equeue/smtp-password"
ca_file = "/etc/equeue/ca.pem"

[[rule]]
name = "billing-lag"
type = "group_lag"
group = "billing-*"
topic = "orders"
messages = 10_000
seconds = 300
for = "2m"

[[rule]]
name = "backlog"
type = "total_unconsumed"
messages = 100_000
scope = "broker"

[[rule]]
name = "dead-letters"
type = "dlq_not_empty"
group = "*"
min = 1

[[rule]]
name = "replicas"
type = "replica_out_of_sync"
broker = "*"
for = "1m"

[[rule]]
name = "disk"
type = "disk_free"
percent = 10

[[rule]]
name = "down"
type = "broker_down"
for = "15s"
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "alarms.toml"
    path.write_text(text)
    return str(path)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_design_example_file_parses_with_defaults_and_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_TOKEN", "s3cret")
    config = load_file(write(tmp_path, FULL))
    rules = {r.name: r for r in config.rules}
    assert list(rules) == ["billing-lag", "backlog", "dead-letters", "replicas", "disk", "down"]
    lag = rules["billing-lag"]
    assert (lag.group, lag.topic, lag.messages, lag.seconds) == ("billing-*", "orders", 10_000, 300)
    assert lag.for_s == 120.0 and lag.resolve_for_s == 30.0 and lag.repeat_s == 3600.0
    assert rules["down"].for_s == 15.0 and rules["disk"].for_s == 30.0
    assert rules["disk"].fires_below and rules["replicas"].binary
    assert rules["backlog"].notify == ("ops", "ops-mail")
    hook = config.notifiers[0]
    assert hook.settings["headers"] == {"Authorization": "Bearer s3cret"}
    assert hook.settings["timeout"] == 5.0
    assert [n.name for n in config.notifiers_for(lag)] == ["ops", "ops-mail"]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (
            'name = "billing-lag"\ntype = "group_lag"\nmessages = -5',
            'alarms.toml: rule 1 ("billing-lag"): messages must be a positive integer, not -5',
        ),
        (
            'name = "x"\ntype = "group_lag"\nmesages = 5',
            "alarms.toml: rule 1 (\"x\"): unknown key 'mesages'",
        ),
        ('name = "x"\ntype = "group_lag"', "needs a threshold (messages or seconds)"),
        ('name = "x"\ntype = "disk_free"\npercent = 150', "percent must be a number from"),
        ('name = "x"\ntype = "lag"\nmessages = 5', "type must be one of group_lag"),
        ('name = "x"\ntype = "group_lag"\nmessages = 5\nfor = "soon"', "for must be a duration"),
        ('name = "x"\ntype = "group_lag"\nmessages = 5\nnotify = ["pager"]', "unknown notifier"),
        ('name = "x"\ntype = "total_unconsumed"\nmessages = 5\nscope = "world"', "scope must be"),
        ('type = "broker_down"', "name must be a non-empty string"),
    ],
)
def test_a_bad_rule_names_the_file_the_rule_and_the_key(
    tmp_path: Path, rule: str, message: str
) -> None:
    with pytest.raises(RuleError) as error:
        load_file(write(tmp_path, f"[[rule]]\n{rule}\n"))
    assert message in str(error.value)


def test_other_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match="unknown key 'rules'"):
        load_file(write(tmp_path, '[[rules]]\nname = "x"\n'))
    with pytest.raises(RuleError, match="not valid TOML"):
        load_file(write(tmp_path, "[[rule]\n"))
    with pytest.raises(RuleError, match="cannot read the rule file"):
        load_file(str(tmp_path / "missing.toml"))
    with pytest.raises(RuleError, match="two rules are named 'a'"):
        load_file(write(tmp_path, '[[rule]]\nname="a"\ntype="broker_down"\n' * 2))
    with pytest.raises(RuleError, match="environment variable NO_SUCH_VAR_E30 is not set"):
        hook = '[[notifier]]\nname="h"\ntype="webhook"\nurl="http://h"\n'
        load_file(write(tmp_path, hook + 'headers = { A = "${NO_SUCH_VAR_E30}" }\n'))
    with pytest.raises(RuleError, match="smtp must be HOST:PORT"):
        load_file(write(tmp_path, '[[notifier]]\nname="m"\ntype="email"\nto="a@b"\nsmtp="x"\n'))


def test_durations() -> None:
    assert parse_duration("500ms", "d") == 0.5
    assert parse_duration("2m", "d") == 120.0
    assert parse_duration("1h", "d") == 3600.0
    assert parse_duration("0s", "d") == 0.0
    assert parse_duration("0", "d") == 0.0
    assert parse_duration(15, "d") == 15.0
    with pytest.raises(RuleError, match="--alarm-for must be a duration"):
        parse_duration("30", "--alarm-for")


def test_flags_make_rules_named_flag_lag_and_flag_total() -> None:
    config = from_args(
        parse(
            "--alarm-lag", "5000", "--alarm-for", "10s", "--alarm-total", "7", "--alarm-repeat", "0"
        )
    )
    lag, total = config.rules
    assert (lag.name, lag.type, lag.messages, lag.group, lag.for_s) == (
        "flag-lag",
        "group_lag",
        5000,
        "*",
        10.0,
    )
    assert (total.name, total.type, total.messages) == ("flag-total", "total_unconsumed", 7)
    assert lag.repeat_s == total.repeat_s == 0.0
    assert config.notifiers == ()


def test_a_notifier_without_rules_turns_on_the_eq_default_total_rule() -> None:
    config = from_args(parse("--alarm-webhook", "http://127.0.0.1:9/hook"))
    assert [(r.name, r.messages) for r in config.rules] == [("flag-total", DEFAULT_TOTAL)]
    assert config.notifiers[0].settings["url"] == "http://127.0.0.1:9/hook"
    assert from_args(parse()).rules == ()


def test_email_flags(tmp_path: Path) -> None:
    config = from_args(
        parse("--alarm-email", "ops@x", "--smtp", "127.0.0.1:2525", "--smtp-user", "u")
    )
    (mail,) = config.notifiers
    assert mail.settings["to"] == ("ops@x",) and mail.settings["username"] == "u"
    with pytest.raises(RuleError, match="--alarm-email needs --smtp"):
        from_args(parse("--alarm-email", "ops@x"))
    with pytest.raises(RuleError, match="--smtp must be HOST:PORT"):
        from_args(parse("--alarm-email", "ops@x", "--smtp", "mail"))
    with pytest.raises(RuleError, match="password in clear"):
        from_args(
            parse(
                "--alarm-email",
                "a@x",
                "--smtp",
                "mail.example:25",
                "--smtp-user",
                "u",
                "--smtp-tls",
                "none",
            )
        )
    with pytest.raises(RuleError, match="--alarm-lag must be a positive integer"):
        from_args(parse("--alarm-lag", "0"))
    with pytest.raises(RuleError, match="--alarm-webhook must start with http"):
        from_args(parse("--alarm-webhook", "hooks.example.com"))


def test_flags_add_to_the_rule_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[[rule]]\nname = "down"\ntype = "broker_down"\n')
    config = from_args(parse("--alarm-rules", path, "--alarm-lag", "10"))
    assert [r.name for r in config.rules] == ["down", "flag-lag"]


def test_the_shipped_example_file_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/alarms.example.toml, read by the console's own parser."""
    monkeypatch.setenv("HOOK_TOKEN", "s3cret")
    example = Path(__file__).parents[2] / "docs" / "alarms.example.toml"
    config = load_file(str(example))
    types = {r.type for r in config.rules}
    assert types == {
        "group_lag", "total_unconsumed", "dlq_not_empty", "replica_out_of_sync",
        "disk_free", "broker_down", "transaction_open", "delayed_overdue",
    }  # fmt: skip
    assert {n.type for n in config.notifiers} == {"webhook", "email"}
    assert all(r.notify == ("ops", "ops-mail") for r in config.rules)


def test_flag_rules_take_the_file_defaults_unless_a_flag_says_otherwise(tmp_path: Path) -> None:
    path = write(tmp_path, '[defaults]\nresolve_for = "5s"\nrepeat = "10m"\nfor = "1m"\n')
    (lag,) = from_args(parse("--alarm-rules", path, "--alarm-lag", "10", "--alarm-for", "2s")).rules
    assert (lag.for_s, lag.resolve_for_s, lag.repeat_s) == (2.0, 5.0, 600.0)
    (lag,) = from_args(parse("--alarm-lag", "10", "--alarm-resolve-for", "1s")).rules
    assert (lag.for_s, lag.resolve_for_s, lag.repeat_s) == (30.0, 1.0, 3600.0)
    with pytest.raises(RuleError, match="--alarm-resolve-for must be a duration"):
        from_args(parse("--alarm-lag", "10", "--alarm-resolve-for", "later"))
