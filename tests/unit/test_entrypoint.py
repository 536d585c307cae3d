"""The image's entrypoint: flags from the command line, TIDEMQ_* variables, a mounted
broker.toml and container defaults, in that order; StatefulSet ordinals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tidemq import cli, entrypoint
from tidemq.entrypoint import EntrypointError, plan
from tidemq.services.broker import config as broker_config

pytestmark = pytest.mark.unit

HOST = "mq-tidemq-broker-a-2"


def flags(argv: list[str]) -> dict[str, str]:
    return {a: b for a, b in zip(argv[1:], [*argv[2:], ""], strict=True) if a.startswith("--")}


def test_nameserver_listens_on_all_interfaces_by_default() -> None:
    launch = plan(["nameserver"], {}, HOST)
    assert launch.argv == ["nameserver", "--listen", "0.0.0.0:9876"]
    assert launch.probe_address == "127.0.0.1:9876"


def test_environment_becomes_flags_and_the_command_line_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(entrypoint, "_own_address", lambda: "10.1.2.3")
    env = {
        "TIDEMQ_BROKER_NAME": "broker-b",
        "TIDEMQ_ZK": "zk:2181",
        "TIDEMQ_LISTEN": "0.0.0.0:1234",
        "TIDEMQ_AUTO_CREATE_TOPICS": "true",
        "TIDEMQ_CONFIRM_OFFSET": "false",
        "TIDEMQ_UNRELATED": "ignored",
    }
    launch = plan(["broker", "--zk=other:2181"], env, HOST)
    got = flags(launch.argv)
    assert got["--broker-name"] == "broker-b"
    assert got["--zk"] == "other:2181"  # the flag, not TIDEMQ_ZK
    assert launch.argv.count("--zk") == 1
    assert "--auto-create-topics" in launch.argv and "--confirm-offset" not in launch.argv
    assert got["--listen"] == "0.0.0.0:1234"
    assert got["--advertise"] == "10.1.2.3:1234"  # this container's address, the listen port
    assert got["--store"] == "/var/lib/tidemq/store"
    assert got["--metrics-listen"] == "0.0.0.0:9108"
    assert launch.probe_address == "127.0.0.1:1234"


def test_a_switch_with_another_value_is_refused() -> None:
    with pytest.raises(EntrypointError, match="--auto-create-topics is a switch"):
        plan(["broker"], {"TIDEMQ_AUTO_CREATE_TOPICS": "maybe"}, HOST)


def test_keys_of_the_mounted_config_are_not_overridden_by_defaults(tmp_path: Path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text('listen = "0.0.0.0:20911"\nmetrics_listen = ""\nadvertise = "b.svc:20911"\n')
    launch = plan(["broker"], {"TIDEMQ_CONFIG": str(toml)}, HOST)
    got = flags(launch.argv)
    assert got["--config"] == str(toml)
    assert "--listen" not in got and "--metrics-listen" not in got and "--advertise" not in got
    assert launch.probe_address == "127.0.0.1:20911"


def test_unreadable_or_invalid_config_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(EntrypointError, match="cannot read the broker config"):
        plan(["broker", "--config", str(tmp_path / "missing.toml")], {}, HOST)
    bad = tmp_path / "bad.toml"
    bad.write_text("listen = \n")
    with pytest.raises(EntrypointError, match="not valid TOML"):
        plan(["broker", "--config", str(bad)], {}, HOST)


@pytest.mark.parametrize(
    ("hostname", "role", "broker_id"),
    [("g-broker-a-0", "SYNC_MASTER", "0"), ("g-broker-a-1", "SLAVE", "1"), (HOST, "SLAVE", "2")],
)
def test_ordinal_gives_the_master_to_pod_0(hostname: str, role: str, broker_id: str) -> None:
    argv = ["broker", "--broker-id", "ordinal", "--role", "ordinal:SYNC_MASTER"]
    got = flags(plan([*argv, "--advertise", "x:1"], {}, hostname).argv)
    assert (got["--role"], got["--broker-id"]) == (role, broker_id)


def test_ordinal_plus_one_numbers_from_one() -> None:
    argv = ["broker", "--broker-id", "ordinal+1", "--advertise", "x:1"]
    assert flags(plan(argv, {}, "g-broker-a-0").argv)["--broker-id"] == "1"


def test_ordinal_needs_a_statefulset_host_name() -> None:
    with pytest.raises(EntrypointError, match="StatefulSet pod"):
        plan(["broker", "--broker-id", "ordinal", "--advertise", "x:1"], {}, "laptop")


def test_other_commands_pass_through_unchanged() -> None:
    launch = plan(["cluster", "status", "--json"], {"TIDEMQ_LISTEN": "0.0.0.0:1"}, HOST)
    assert launch.argv == ["cluster", "status", "--json"]
    assert launch.probe_address is None


def test_healthcheck_without_a_started_server_fails(tmp_path: Path) -> None:
    assert entrypoint.healthcheck({"TIDEMQ_HEALTH_FILE": str(tmp_path / "none")}) == 1


def broker_config_of(argv: list[str]) -> broker_config.BrokerConfig:
    """The BrokerConfig the broker builds from what the entrypoint runs (its TOML and flags)."""
    parsed = vars(cli.build_parser().parse_args(argv))
    keys = {f.name for f in dataclasses.fields(broker_config.BrokerConfig)}
    return broker_config.load(parsed.get("config"), {k: parsed[k] for k in keys if k in parsed})


def test_the_broker_serves_the_rocketmq_protocol_advertising_this_container_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(entrypoint, "_own_address", lambda: "10.1.2.3")
    cfg = broker_config_of(plan(["broker"], {}, HOST).argv)
    assert cfg.rocketmq_listen == "0.0.0.0:8081"
    assert cfg.rocketmq_advertised == "10.1.2.3:8081"  # what the routes name: reachable
    moved = plan(["broker"], {"TIDEMQ_ROCKETMQ_LISTEN": "0.0.0.0:18081"}, HOST).argv
    assert broker_config_of(moved).rocketmq_advertised == "10.1.2.3:18081"
    named = {"TIDEMQ_ROCKETMQ_ADVERTISE": "mq.example:443"}
    assert broker_config_of(plan(["broker"], named, HOST).argv).rocketmq_advertised == (
        "mq.example:443"
    )


def test_an_empty_rocketmq_listen_turns_the_listener_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """From the environment or the mounted config (as the Helm chart writes it when off): no
    listener, and no advertised address the broker would refuse without one."""
    monkeypatch.setattr(entrypoint, "_own_address", lambda: "10.1.2.3")
    off = plan(["broker"], {"TIDEMQ_ROCKETMQ_LISTEN": ""}, HOST).argv
    assert "--rocketmq-advertise" not in off
    assert broker_config_of(off).rocketmq_advertised == ""
    toml = tmp_path / "broker.toml"
    toml.write_text('rocketmq_listen = ""\n')
    off = plan(["broker", "--config", str(toml)], {}, HOST).argv
    assert "--rocketmq-listen" not in off and "--rocketmq-advertise" not in off
    assert broker_config_of(off).rocketmq_advertised == ""


def test_standalone_is_dev_on_all_interfaces_advertising_the_handed_addresses(
    tmp_path: Path,
) -> None:
    advertise = tmp_path / "advertise.toml"
    advertise.write_text('advertise = "localhost:32770"\nrocketmq_advertise = "localhost:32771"\n')
    launch = plan(["standalone"], {"TIDEMQ_ADVERTISE_FILE": str(advertise)}, HOST)
    assert launch.argv[0] == "dev"
    f = flags(launch.argv)
    assert f["--bind"] == "0.0.0.0"
    assert (f["--advertise"], f["--rocketmq-advertise"]) == ("localhost:32770", "localhost:32771")
    assert (f["--slave-port"], f["--console-port"]) == ("0", "0")
    assert "--logs-to-stdout" in launch.argv
    assert launch.probe_address == "127.0.0.1:10911"
    env = {"TIDEMQ_ADVERTISE": "localhost:10911"}  # docker run -p 10911:10911 -e ...
    assert flags(plan(["standalone"], env, HOST).argv)["--advertise"] == "localhost:10911"
    # What follows the command goes to dev, after the defaults (argparse: the last one wins).
    assert plan(["standalone", "--flush", "SYNC"], {}, HOST).argv[-2:] == ["--flush", "SYNC"]
    # Every flag planned is one dev takes.
    parsed = cli.build_parser().parse_args(launch.argv)
    assert parsed.bind == "0.0.0.0" and parsed.advertise == "localhost:32770"


def test_a_bad_advertise_file_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    advertise = tmp_path / "advertise.toml"
    env = {"TIDEMQ_ADVERTISE_FILE": str(advertise)}
    for text, says in [
        ('advertise = "no-port"\n', 'must be "HOST:PORT"'),
        ('advertise = "h:1"\nlisten = "x"\n', "unknown keys: listen"),
        ("advertise = \n", "not valid TOML"),
    ]:
        advertise.write_text(text)
        with pytest.raises(EntrypointError, match=says):
            plan(["standalone"], env, HOST)


def test_standalone_waits_for_its_advertise_file_then_gives_up(tmp_path: Path) -> None:
    missing = tmp_path / "never.toml"
    with pytest.raises(EntrypointError, match="did not appear within 0 s"):
        entrypoint.wait_for_file(str(missing), timeout_s=0.0)
    missing.write_text("")
    entrypoint.wait_for_file(str(missing), timeout_s=0.0)  # there: returns at once
