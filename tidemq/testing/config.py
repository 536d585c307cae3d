"""What the test cluster's containers run with: the images (named by the environment), the
labels a cleanup finds them by, short ZooKeeper ticks and small broker stores, and the
``broker.toml`` those broker settings are written as."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidemq import __version__

IMAGE_ENV = "TIDEMQ_TEST_IMAGE"
ZOOKEEPER_IMAGE_ENV = "TIDEMQ_TEST_ZOOKEEPER_IMAGE"
# Set by whoever runs a test session (docker/with-engine.sh) to find and remove what a crashed
# session left behind.
RUN_LABEL_ENV = "TIDEMQ_TESTING_RUN"
LABEL = "io.tidemq.testing"

# What `make image` builds and the Helm chart pulls by default (docs/deployment.md).
DEFAULT_IMAGE = f"ghcr.io/tidemq/tidemq:{__version__}"
# The official image; any image honouring its ZOO_* variables works (docker/zookeeper/).
DEFAULT_ZOOKEEPER_IMAGE = "zookeeper:3.8"

# Short ZooKeeper ticks so sessions can expire within seconds (the server allows session
# timeouts of 2 to 20 ticks), and brokers whose death is noticed within 4 s.
ZOOKEEPER_TICK_MS = 500
DEFAULT_BROKER_CONFIG: Mapping[str, Any] = {
    "zk_session_timeout_ms": 4_000,
    # Small store files: a test broker should not preallocate gigabytes.
    "store_overrides": {
        "commitlog_file_size_bytes": 64 << 20,
        "consume_queue_entries_per_file": 100_000,
        "index_slot_num": 50_000,
        "index_max_num": 200_000,
    },
}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, Sequence):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def broker_toml(config: Mapping[str, Any]) -> str:
    """A broker.toml of ``BrokerConfig`` keys (services/broker/config.py)."""
    return "".join(f"{key} = {_toml_value(value)}\n" for key, value in config.items())
