"""``tidemq broker-group config show|set``: a broker group's settings, and the change of those
that apply without a restart (mqadmin getBrokerConfig/updateBrokerConfig). ``set`` goes to the
master, which keeps the change across restarts and hands it to its slaves."""

from __future__ import annotations

import argparse

from tidemq.admin import Admin
from tidemq.admin.broker_config import BrokerSetting
from tidemq.cli.common import add_nameserver, print_json
from tidemq.cli.tables import print_table


def parse_assignments(items: list[str]) -> dict[str, str]:
    """``["a=1", "b="]`` -> ``{"a": "1", "b": ""}`` (an empty value: back to the file's)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} must be KEY=VALUE (KEY= puts the file's value back)")
        if key.strip() in out:
            raise ValueError(f"{key.strip()} is given twice")
        out[key.strip()] = value.strip()
    return out


def _print(settings: list[BrokerSetting]) -> None:
    print_table(
        ("KEY", "VALUE", "CONFIG_FILE", "RUNTIME"),
        [
            (
                s.key,
                s.value,
                s.file_value if s.changed_at_runtime else None,
                "yes" if s.changeable else "restart",
            )
            for s in settings
        ],
    )


def cmd_show(args: argparse.Namespace) -> int:
    with Admin(args.nameserver) as admin:
        settings = admin.broker_config(args.broker_group, args.broker_id)
    if args.changeable:
        settings = [s for s in settings if s.changeable]
    if args.json:
        print_json([s.as_dict() for s in settings])
    else:
        _print(settings)
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    changes = parse_assignments(args.settings)
    with Admin(args.nameserver) as admin:
        changed, settings = admin.update_broker_config(args.broker_group, changes)
    if args.json:
        print_json({"changed": changed, "settings": [s.as_dict() for s in settings]})
        return 0
    print(
        f"{args.broker_group}: {len(changed)} setting(s) changed"
        + (f" ({', '.join(changed)})" if changed else "")
        + "; slaves take them with the next config sync"
    )
    _print(settings)
    return 0


def add_parsers(gsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = gsub.add_parser("config", help="show or change a broker group's settings")
    csub = c.add_subparsers(dest="broker_config_command", required=True)
    show = csub.add_parser(
        "show", help="every setting; RUNTIME yes: `set` changes it without a restart"
    )
    show.add_argument("broker_group", metavar="BROKER_GROUP")
    show.add_argument(
        "--broker-id", type=int, default=0, help="read this broker of the group (default master)"
    )
    show.add_argument("--changeable", action="store_true", help="only the runtime settings")
    show.set_defaults(func=cmd_show)
    st = csub.add_parser(
        "set",
        help="change runtime settings on the master (kept across restarts, copied to slaves)",
        description="KEY=VALUE ... applied together or not at all; KEY= puts the config "
        "file's value back. `config show --changeable` lists the keys.",
    )
    st.add_argument("broker_group", metavar="BROKER_GROUP")
    st.add_argument("settings", nargs="+", metavar="KEY=VALUE")
    st.set_defaults(func=cmd_set)
    for p in (show, st):
        p.add_argument("--json", action="store_true")
        add_nameserver(p)
