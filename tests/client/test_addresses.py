"""Broker addresses are checked before anything is dialled, by one function
(``check_address``) that the client, the CLI and the Spark connector share."""

from __future__ import annotations

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_spark.cli.app import main
from equeue_spark.client import Admin, ClientConfig, Producer
from equeue_spark.client.connection import check_address
from equeue_spark.client.errors import InvalidAddress

BAD = [
    ("127.0.0.1", "has no port"),  # gRPC would dial port 443
    ("127.0.0.1:99999", "has port 99999, outside 1-65535"),  # gRPC would wrap it to 34463
    (":99999", "has no host"),
    ("a:5000,b:5000", "is not one address"),  # gRPC would fail late, with a DNS error
    ("broker 5000", "is not one address"),
    ("host:http", "has port 'http', not a number"),
    ("::1:5000", "write an IPv6 host in brackets"),
    ("[nope]:5000", "not an IPv6 address"),
    ("", "is empty"),
]


@pytest.mark.parametrize(("address", "why"), BAD)
def test_client_refuses_a_bad_address_naming_it(address: str, why: str) -> None:
    with pytest.raises(InvalidAddress, match=why) as caught:
        check_address(address)
    assert repr(address) in str(caught.value) and "HOST:PORT" in str(caught.value)
    if address:  # "" means the default in ClientConfig
        with pytest.raises(InvalidAddress, match=why):
            ClientConfig(broker=address)
        with pytest.raises(ValueError, match=why):  # InvalidAddress is a ValueError too
            Producer(address)


@pytest.mark.parametrize("address", ["127.0.0.1:5000", "localhost:1", "[::1]:65535", " h_1.x:80 "])
def test_good_addresses_pass(address: str) -> None:
    assert check_address(address) == address.strip()


def test_bad_environment_default_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EQUEUE_BROKER", "10.0.0.1")
    with pytest.raises(InvalidAddress, match=r"\$EQUEUE_BROKER '10.0.0.1' has no port"):
        ClientConfig()
    assert ClientConfig(broker="127.0.0.1:5000").target == "127.0.0.1:5000"  # given wins


def test_a_good_address_still_connects(broker: BrokerProcess) -> None:
    with Admin(f"  {broker.address} ") as admin:
        assert admin.list_topics() is not None


@pytest.mark.parametrize(("address", "why"), BAD[:4])
def test_cli_broker_flag_is_a_usage_error(
    address: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["topics", "list", "--broker", address, "--timeout-s", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--broker {address!r} {why}" in err and "Traceback" not in err


def test_cli_environment_broker_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EQUEUE_BROKER", "a:1,b:2")
    code = main(["topics", "list", "--timeout-s", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "$EQUEUE_BROKER 'a:1,b:2' is not one address" in err


def test_name_server_lists_are_checked_and_exclusive_with_a_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from equeue_spark.client.connection import NAMESRV_ENV, parse_namesrv

    assert parse_namesrv("a:1, b:2") == ("a:1", "b:2")
    assert parse_namesrv(["a:1", "b:2"]) == ("a:1", "b:2")
    with pytest.raises(InvalidAddress, match="has no port"):
        parse_namesrv("a:1,b")
    with pytest.raises(InvalidAddress, match="names no name server"):
        parse_namesrv(" , ")
    with pytest.raises(InvalidAddress, match="the limit is 16"):
        parse_namesrv([f"h:{i}" for i in range(1, 18)])
    with pytest.raises(ValueError, match="not both"):
        ClientConfig(broker="a:1", namesrv="b:2")
    assert ClientConfig(namesrv="b:2").is_cluster
    monkeypatch.setenv(NAMESRV_ENV, "n1:9876,n2:9876")
    assert ClientConfig().namesrvs() == ("n1:9876", "n2:9876")  # the env wins with no broker
    assert not ClientConfig(broker="a:1").is_cluster  # an explicit broker wins over it
    assert ClientConfig(namesrv="x:1").for_broker("a:1").namesrvs() == ()


def test_cli_refuses_broker_and_namesrv_together_and_per_broker_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--broker", "a:1", "--namesrv", "b:2", "topics", "list"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["--namesrv", "b", "topics", "list"]) == 2
    assert "--namesrv address 'b' has no port" in capsys.readouterr().err
    assert main(["--broker", "127.0.0.1:1", "cluster", "list"]) == 2
    assert "--namesrv" in capsys.readouterr().err


def test_spark_options_take_a_name_server_list() -> None:
    pytest.importorskip("pyarrow")
    from equeue_spark.spark.errors import InvalidOption
    from equeue_spark.spark.options import ReadOptions, WriteOptions

    read = ReadOptions.parse({"namesrv": "n1:1,n2:2", "topic": "t"}, streaming=False)
    assert read.namesrv == ("n1:1", "n2:2") and read.cluster and read.client.is_cluster
    assert WriteOptions.parse({"namesrv": "n1:1", "topic": "t"}).cluster
    with pytest.raises(InvalidOption, match="not both"):
        ReadOptions.parse({"namesrv": "n1:1", "broker": "b:1", "topic": "t"}, streaming=False)
    with pytest.raises(InvalidOption, match="option namesrv='n1'"):
        WriteOptions.parse({"namesrv": "n1", "topic": "t"})
    spec = ReadOptions.parse(
        {"namesrv": "n1:1", "topic": "t", "startingOffsets": '{"t": {"a/0": 5, "b/1": -2}}'},
        streaming=True,
    ).starting
    assert spec == {"a/t": {0: 5}, "b/t": {1: -2}}


def test_spark_options_carry_the_drivers_name_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither broker nor namesrv given: the driver's $EQUEUE_NAMESRV is resolved
    when the options are parsed, so the queues are named as a cluster's and the
    tasks (which get the options, not the driver's environment) read the same
    cluster."""
    pytest.importorskip("pyarrow")
    from equeue_spark.client.connection import NAMESRV_ENV
    from equeue_spark.spark.errors import InvalidOption
    from equeue_spark.spark.options import ReadOptions, WriteOptions

    monkeypatch.setenv(NAMESRV_ENV, "n1:1,n2:2")
    read = ReadOptions.parse({"topic": "t", "startingOffsets": '{"t": {"a/0": 5}}'}, streaming=True)
    assert read.namesrv == ("n1:1", "n2:2") and read.broker == ""
    assert read.starting == {"a/t": {0: 5}}
    monkeypatch.delenv(NAMESRV_ENV)
    assert read.client.namesrvs() == ("n1:1", "n2:2")  # not the task's environment
    monkeypatch.setenv(NAMESRV_ENV, "n1:1")
    assert WriteOptions.parse({"topic": "t"}).namesrv == ("n1:1",)
    assert WriteOptions.parse({"topic": "t", "broker": "b:1"}).namesrv == ()  # broker wins
    with pytest.raises(InvalidOption, match="names no broker group"):
        ReadOptions.parse({"topic": "t", "startingOffsets": '{"t": {"0": 5}}'}, streaming=True)
    monkeypatch.setenv(NAMESRV_ENV, "n1")
    with pytest.raises(InvalidOption, match=r"no broker or namesrv option, and \$EQUEUE_NAMESRV"):
        ReadOptions.parse({"topic": "t"}, streaming=False)
