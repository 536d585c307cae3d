"""The accounts the security tests use: an ACL file in plain_acl.yml form (docs/security.md), the
credentials of each account, and a broker config that signs the broker's own calls as ops."""

from __future__ import annotations

from pathlib import Path

from tidemq.protos.signing import Credentials

ACL = """
accounts:
  - accessKey: ops
    secretKey: ops-secret
    admin: true
  - accessKey: app
    secretKey: app-secret
    topicPerms:
      - orders=PUB|SUB
    groupPerms:
      - billing=SUB
  - accessKey: nobody
    secretKey: nobody-secret
"""
OPS = Credentials("ops", "ops-secret")
APP = Credentials("app", "app-secret")
NOBODY = Credentials("nobody", "nobody-secret")


def write_acl(directory: Path) -> Path:
    path = directory / "plain_acl.yml"
    path.write_text(ACL)
    return path


def broker_config_as_ops(directory: Path) -> Path:
    """A broker TOML config whose broker signs its registrations and syncs as ops."""
    path = directory / "broker.toml"
    path.write_text('access_key = "ops"\nsecret_key = "ops-secret"\n')
    return path
