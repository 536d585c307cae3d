"""The container image's entrypoint: ``python -m tidemq.entrypoint COMMAND [FLAGS...]``.

``nameserver`` and ``broker`` run in this very process (no shell, no child: SIGTERM reaches the
server, which drains and stops cleanly), with their flags taken from, in order of precedence:

1. the flags after the command;
2. environment variables ``TIDEMQ_<FLAG>``: ``TIDEMQ_BROKER_NAME=broker-a`` is
   ``--broker-name broker-a``; a switch such as ``--auto-create-topics`` is on for ``true``/``1``;
3. for the broker, its TOML config (``--config``): ``/etc/tidemq/broker.toml`` when mounted;
4. container defaults: listen on all interfaces (9876, 10911), the store on the volume
   ``/var/lib/tidemq/store``, metrics on ``0.0.0.0:9108``, RocketMQ 5's protocol on
   ``0.0.0.0:8081``, and the broker advertising this container's IP address with each port.
   An empty value (``TIDEMQ_ROCKETMQ_LISTEN=``) turns a listener off.

Two values serve StatefulSets, where every pod has the same spec: ``--broker-id ordinal`` is the
pod's ordinal (the number that ends its host name), ``ordinal+1`` that plus one (automatic
failover numbers brokers from 1), and ``--role ordinal:SYNC_MASTER`` means ``SYNC_MASTER`` for
pod 0 and ``SLAVE`` for the others.

``standalone`` runs a nameserver on the embedded registry and one master broker in this
container (``tidemq dev`` without a slave or console), for tests and trying tidemq out: the
nameserver on 9876, the broker on 10911, its RocketMQ 5 listener on 8081, topics created on
first use, the store on the volume, every server's log on the container's output. Clients
outside reach the broker where it advertises itself: this container's IP address by default,
``TIDEMQ_ADVERTISE`` and ``TIDEMQ_ROCKETMQ_ADVERTISE`` (``HOST:PORT``) if set; with
``TIDEMQ_ADVERTISE_FILE`` set, it waits (up to two minutes) for that file, a TOML of
``advertise`` and ``rocketmq_advertise`` (``"HOST:PORT"``), to appear. That is how
``tidemq.testing.TidemqContainer`` hands it the host-mapped ports, known only once the
container runs.

``healthcheck`` asks the server this container started whether it serves (exit 0 or 1), for the
image's HEALTHCHECK. Any other command is passed to the ``tidemq`` CLI unchanged.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidemq import cli

ENV_PREFIX = "TIDEMQ_"
DEFAULT_BROKER_CONFIG = "/etc/tidemq/broker.toml"
# Where the server's probe address is left for ``healthcheck`` (a separate process that cannot
# see the server's flags).
HEALTH_FILE_ENV = "TIDEMQ_HEALTH_FILE"
DEFAULT_HEALTH_FILE = "/tmp/tidemq-health-address"

SERVERS = ("nameserver", "broker")
STANDALONE = "standalone"
ADVERTISE_FILE_ENV = "TIDEMQ_ADVERTISE_FILE"
ADVERTISE_WAIT_S = 120.0
STANDALONE_PORTS = {"nameserver": 9876, "broker": 10911, "rocketmq": 8081}
DEFAULT_STORE = "/var/lib/tidemq/store"
DEFAULTS: Mapping[str, Mapping[str, str]] = {
    "nameserver": {"listen": "0.0.0.0:9876"},
    "broker": {
        "listen": "0.0.0.0:10911",
        "store_dir": DEFAULT_STORE,
        "metrics_listen": "0.0.0.0:9108",
        "rocketmq_listen": "0.0.0.0:8081",
    },
}
# A broker's listeners and the flags naming the address others reach each at: by default this
# container's address with the listener's port.
ADVERTISED = (("--listen", "--advertise"), ("--rocketmq-listen", "--rocketmq-advertise"))
ORDINAL = "ordinal"
# "ordinal" or "ordinal+N": automatic failover numbers brokers from 1 (0 is the master's id).
ORDINAL_ID = re.compile(r"ordinal(?:\+(\d+))?")
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


class EntrypointError(Exception):
    """A setting the entrypoint cannot turn into flags; one line for the operator."""


@dataclass(frozen=True)
class Launch:
    argv: list[str]  # for tidemq.cli.main
    probe_address: str | None  # HOST:PORT of the health service, for servers


def options_of(command: str) -> dict[str, argparse.Action]:
    """The command's flags by their long name (``--broker-name``)."""
    parser = cli.build_parser()
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices[command]
            return {
                opt: a
                for a in sub._actions
                for opt in a.option_strings
                if opt.startswith("--") and opt != "--help"
            }
    raise AssertionError("the tidemq CLI has no subcommands")


def _given(args: Sequence[str], option: str) -> str | None:
    """The value of ``option`` among ``args`` (split by ``_split_equals``), None if absent."""
    for i, arg in enumerate(args):
        if arg == option:
            return args[i + 1] if i + 1 < len(args) else ""
    return None


def _from_env(
    options: Mapping[str, argparse.Action], args: Sequence[str], env: Mapping[str, str]
) -> list[str]:
    flags: list[str] = []
    for option, action in options.items():
        value = env.get(ENV_PREFIX + option[2:].replace("-", "_").upper())
        if value is None or _given(args, option) is not None:
            continue
        if action.nargs == 0:  # a switch
            if value.lower() in TRUE:
                flags.append(option)
            elif value.lower() not in FALSE:
                raise EntrypointError(f"{option} is a switch: true or false, not {value!r}")
        else:
            flags += [option, value]
    return flags


def _config_keys(path: str | None, what: str = "the broker config") -> dict[str, object]:
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise EntrypointError(f"cannot read {what} {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise EntrypointError(f"{what} {path} is not valid TOML: {e}") from None


def ordinal(hostname: str) -> int:
    """A StatefulSet pod's ordinal: the number after the last ``-`` of its host name."""
    digits = hostname.split(".", maxsplit=1)[0].rpartition("-")[2]
    if not digits.isdigit():
        raise EntrypointError(
            f"'{ORDINAL}' needs a host name ending in -<number> (a StatefulSet pod), "
            f"not {hostname!r}"
        )
    return int(digits)


def _resolve_ordinals(args: list[str], hostname: str) -> list[str]:
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        value = out[i + 1]
        if arg == "--broker-id" and (match := ORDINAL_ID.fullmatch(value)):
            out[i + 1] = str(ordinal(hostname) + int(match.group(1) or 0))
        elif arg == "--role" and value.startswith(ORDINAL + ":"):
            out[i + 1] = value.partition(":")[2] if ordinal(hostname) == 0 else "SLAVE"
    return out


def _split_equals(args: Sequence[str]) -> list[str]:
    """``--x=v`` as ``--x v``, so every flag's value is the next argument."""
    out: list[str] = []
    for arg in args:
        if arg.startswith("--") and "=" in arg:
            out += arg.split("=", 1)
        else:
            out.append(arg)
    return out


def _own_address() -> str:
    """This container's IP address on its (first) network: what other containers reach."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def read_advertised(path: str) -> dict[str, str]:
    """``advertise`` and ``rocketmq_advertise`` from the advertise file, checked."""
    keys = _config_keys(path, "the advertise file")
    out: dict[str, str] = {}
    for key in ("advertise", "rocketmq_advertise"):
        value = keys.get(key)
        if value is None:
            continue
        host, sep, port = str(value).rpartition(":")
        if not isinstance(value, str) or not sep or not host or not port.isdigit():
            raise EntrypointError(f'{key} in {path} must be "HOST:PORT", not {value!r}')
        out[key] = value
    unknown = sorted(set(keys) - {"advertise", "rocketmq_advertise"})
    if unknown:
        raise EntrypointError(f"{path} has unknown keys: {', '.join(unknown)}")
    return out


def wait_for_file(path: str, timeout_s: float = ADVERTISE_WAIT_S) -> None:
    """Until ``path`` exists; whoever writes it renames it into place, so it is whole."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise EntrypointError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.05)


def plan_standalone(args: Sequence[str], advertised: Mapping[str, str]) -> Launch:
    """``tidemq dev`` as one container's nameserver and master; ``args`` are more dev flags."""
    ports = STANDALONE_PORTS
    own = _own_address()
    argv = [
        "dev",
        *("--data", DEFAULT_STORE, "--bind", "0.0.0.0", "--logs-to-stdout"),
        *("--slave-port", "0", "--console-port", "0"),
        *("--nameserver-port", str(ports["nameserver"]), "--broker-port", str(ports["broker"])),
        *("--rocketmq-port", str(ports["rocketmq"])),
        "--advertise",
        advertised.get("advertise", f"{own}:{ports['broker']}"),
        "--rocketmq-advertise",
        advertised.get("rocketmq_advertise", f"{own}:{ports['rocketmq']}"),
        *args,
    ]
    return Launch(argv, f"127.0.0.1:{ports['broker']}")


def plan(argv: Sequence[str], env: Mapping[str, str], hostname: str) -> Launch:
    """What to run for ``argv`` (the entrypoint's arguments) in environment ``env``."""
    if argv[:1] == [STANDALONE]:
        path = env.get(ADVERTISE_FILE_ENV)
        from_env = {
            key: env[ENV_PREFIX + key.upper()]
            for key in ("advertise", "rocketmq_advertise")
            if env.get(ENV_PREFIX + key.upper())
        }
        return plan_standalone(argv[1:], read_advertised(path) if path else from_env)
    if not argv or argv[0] not in SERVERS:
        return Launch(list(argv), None)
    command, args = argv[0], _split_equals(argv[1:])
    options = options_of(command)
    args += _from_env(options, args, env)
    config: dict[str, object] = {}
    if command == "broker":
        path = _given(args, "--config")  # a flag or TIDEMQ_CONFIG
        if path is None and os.path.exists(DEFAULT_BROKER_CONFIG):
            path = DEFAULT_BROKER_CONFIG
            args += ["--config", path]
        config = _config_keys(path)
    dests = {a.dest: opt for opt, a in options.items()}
    for dest, value in DEFAULTS[command].items():
        if _given(args, dests[dest]) is None and dest not in config:
            args += [dests[dest], value]
    listen = _given(args, "--listen") or str(config.get("listen", ""))
    port = listen.rpartition(":")[2]
    if command == "broker":
        for listen_flag, advertise_flag in ADVERTISED:
            address = _given(args, listen_flag)
            if address is None:
                address = str(config.get(options[listen_flag].dest, ""))
            advertised = _given(args, advertise_flag) is not None
            if address and not advertised and options[advertise_flag].dest not in config:
                args += [advertise_flag, f"{_own_address()}:{address.rpartition(':')[2]}"]
    args = _resolve_ordinals(args, hostname)
    return Launch([command, *args], f"127.0.0.1:{port}")


def healthcheck(env: Mapping[str, str]) -> int:
    path = Path(env.get(HEALTH_FILE_ENV, DEFAULT_HEALTH_FILE))
    try:
        address = path.read_text().strip()
    except OSError:
        print(f"no server started in this container yet ({path} missing)")
        return 1
    return cli.main(["health", address])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ
    if argv[:1] == ["healthcheck"]:
        return healthcheck(env)
    try:
        if argv[:1] == [STANDALONE] and env.get(ADVERTISE_FILE_ENV):
            wait_for_file(env[ADVERTISE_FILE_ENV])
        launch = plan(argv, env, socket.gethostname())
    except EntrypointError as e:
        print(f"tidemq entrypoint: {e}", file=sys.stderr)
        return 2
    if launch.probe_address is not None:
        try:
            Path(env.get(HEALTH_FILE_ENV, DEFAULT_HEALTH_FILE)).write_text(launch.probe_address)
        except OSError as e:  # a read-only root file system: only HEALTHCHECK needs the file
            print(f"tidemq entrypoint: healthcheck disabled: {e}", file=sys.stderr)
        print(f"tidemq entrypoint: tidemq {' '.join(launch.argv)}", file=sys.stderr, flush=True)
    return cli.main(launch.argv)


if __name__ == "__main__":
    sys.exit(main())
