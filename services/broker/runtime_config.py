"""Broker settings changed while it runs (mqadmin's updateBrokerConfig/getBrokerConfig), kept in
``{store}/config/runtimeConfig.json`` so a restart keeps them, and copied by slaves from their
master with the config sync.

Only settings the running code reads at each use are changeable (``CHANGEABLE``): the load
limits the request handlers read from the broker's config, and the retention rules the cleaner
reads from the store's config at each pass. Settings a component copied when it started (flush
and commit intervals: the flush threads' periods; admission limits: the admission queues;
timer and transaction periods) need a restart and are refused here by name.

The config file (and flags) give each setting its *file value*; the runtime file holds the
overrides on top. Every change is validated as the file is, against the whole config (the same
``__post_init__`` checks: ``max_pull_response_bytes <= max_request_bytes``, the disk ratios'
order), before anything is applied; then the new values are written into the live config
objects, which every handler and the cleaner share, so the next request or pass sees them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tidemq.services.broker.config import BrokerConfig
from tidemq.storage import StoreConfig
from tidemq.storage.atomic_file import read_json_with_fallback, write_json_atomic
from tidemq.storage.errors import ConfigError

log = logging.getLogger(__name__)

FILE_NAME = "runtimeConfig.json"


def _int(text: str) -> int:
    return int(text.strip().replace("_", ""))


def _float(text: str) -> float:
    return float(text)


def _bool(text: str) -> bool:
    value = {"true": True, "false": False}.get(text.strip().lower())
    if value is None:
        raise ValueError("true or false")
    return value


def _hours(text: str) -> tuple[int, ...]:
    return tuple(int(h) for h in text.split(",") if h.strip())


# key -> how its text (the RPC's, the CLI's key=value) becomes a value.
BROKER_KEYS: dict[str, Callable[[str], Any]] = {
    "max_pull_response_bytes": _int,
    "long_poll_max_ms": _int,
    "max_batch_messages": _int,
    "max_receive_messages": _int,
    "max_handles_per_call": _int,
    "receive_min_invisible_ms": _int,
    "receive_max_invisible_ms": _int,
}
STORE_KEYS: dict[str, Callable[[str], Any]] = {
    "file_reserved_time_hours": _float,
    "delete_when_hours": _hours,
    "delete_file_batch_max": _int,
    "disk_max_used_space_ratio": _float,
    "disk_space_clean_forcibly_ratio": _float,
    "disk_space_warning_level_ratio": _float,
    "force_delete_unconsumed": _bool,
}
CHANGEABLE = {**BROKER_KEYS, **STORE_KEYS}
# Never shown: credentials, and what is not a plain setting.
_HIDDEN = {"secret_key", "zk_auth", "store_host_packed", "replication", "store_overrides"}


class RuntimeConfigError(ValueError):
    """A change refused as a whole; ``key`` names the setting at fault ("" for a combination)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Entry:
    key: str
    value: str
    file_value: str
    changeable: bool


def _text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "value"):  # an enum
        return str(value.value)
    return str(value)


def _to_json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _from_json(key: str, value: Any) -> Any:
    # A stored or synced value goes through the same parser as typed text, so a hand-edited
    # file or an odd master cannot slip a wrong type into the live config.
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    elif isinstance(value, bool):
        value = "true" if value else "false"
    return parse_value(key, str(value))


def parse_value(key: str, text: str) -> Any:
    parser = CHANGEABLE.get(key)
    if parser is None:
        raise RuntimeConfigError(key, _not_changeable(key))
    try:
        return parser(text)
    except ValueError:
        raise RuntimeConfigError(key, f"{key}: {text!r} is not a valid value") from None


def _not_changeable(key: str) -> str:
    names = {f.name for f in dataclasses.fields(BrokerConfig)} | {
        f.name for f in dataclasses.fields(StoreConfig)
    }
    if key in names - _HIDDEN:
        return (
            f"{key} cannot change while the broker runs (set it in the config file and restart); "
            f"changeable: {', '.join(sorted(CHANGEABLE))}"
        )
    return f"unknown setting {key!r}; changeable: {', '.join(sorted(CHANGEABLE))}"


class RuntimeConfig:
    def __init__(self, broker: BrokerConfig, store: StoreConfig, store_dir: str) -> None:
        self.broker = broker
        self.store = store
        self.path = os.path.join(store_dir, "config", FILE_NAME)
        self._lock = threading.Lock()
        self.file_values = {k: getattr(broker, k) for k in BROKER_KEYS} | {
            k: getattr(store, k) for k in STORE_KEYS
        }
        self.overrides: dict[str, Any] = {}
        stored = self._load()
        if stored:
            try:
                self._apply(stored)
            except RuntimeConfigError as e:
                raise ConfigError(
                    f"{self.path}: {e}; fix or delete the file (the config file's values then "
                    "apply)"
                ) from None
            log.info("runtime settings from %s: %s", self.path, self.overrides)

    def _load(self) -> dict[str, Any]:
        try:
            # The newest write, or its .bak when a crash left the newest unreadable.
            data = read_json_with_fallback(self.path)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{self.path}: not readable JSON ({e})") from None
        if data is None:
            return {}
        if not isinstance(data, dict) or not isinstance(data.get("settings", {}), dict):
            raise ConfigError(f'{self.path}: expected {{"settings": {{KEY: VALUE}}}}')
        try:
            return {k: _from_json(k, v) for k, v in data.get("settings", {}).items()}
        except RuntimeConfigError as e:
            raise ConfigError(f"{self.path}: {e}") from None

    def _apply(self, overrides: Mapping[str, Any]) -> list[str]:
        """Validate the file values with ``overrides`` on top as one config, then write them into
        the live objects; returns the keys whose value changed. Raises before changing anything."""
        values = {**self.file_values, **overrides}
        broker_values = {k: values[k] for k in BROKER_KEYS}
        store_values = {k: values[k] for k in STORE_KEYS}
        try:
            dataclasses.replace(self.broker, **broker_values)
            dataclasses.replace(self.store, **store_values)
        except ConfigError as e:
            raise RuntimeConfigError("", str(e)) from None
        changed = [k for k, v in values.items() if v != self._live(k)]
        for k in changed:
            # The one place a config object changes after start: these fields are read at each
            # use by whoever holds the object, so every holder sees the new value at once.
            object.__setattr__(self.broker if k in BROKER_KEYS else self.store, k, values[k])
        self.overrides = dict(overrides)
        return changed

    def _live(self, key: str) -> Any:
        return getattr(self.broker if key in BROKER_KEYS else self.store, key)

    def update(self, changes: Mapping[str, str]) -> list[str]:
        """Apply ``key -> text`` (an empty text: back to the file value); returns the keys that
        changed. RuntimeConfigError names the first bad key; then nothing changed."""
        if not changes:
            raise RuntimeConfigError("", "no settings given (KEY=VALUE ...)")
        with self._lock:
            overrides = dict(self.overrides)
            for key, text in sorted(changes.items()):
                if key not in CHANGEABLE:
                    raise RuntimeConfigError(key, _not_changeable(key))
                if text == "":
                    overrides.pop(key, None)
                else:
                    overrides[key] = parse_value(key, text)
            changed = self._apply(overrides)
            self._persist()
        if changed:
            log.info("runtime settings changed: %s", {k: self._live(k) for k in changed})
        return changed

    def replace_all(self, overrides_json: str) -> bool:
        """A slave taking its master's overrides (``to_json``); returns whether any value
        changed. A master's value this broker refuses is logged and the sync goes on."""
        try:
            raw = json.loads(overrides_json) if overrides_json else {}
            overrides = {k: _from_json(k, v) for k, v in raw.items()}
            with self._lock:
                if overrides == self.overrides:
                    return False
                changed = self._apply(overrides)
                self._persist()
        except (ValueError, AttributeError) as e:
            log.warning("config sync: the master's runtime settings were not taken: %s", e)
            return False
        if changed:
            log.info("config sync: runtime settings from the master: %s", self.overrides)
        return bool(changed)

    def to_json(self) -> str:
        with self._lock:
            return json.dumps({k: _to_json(v) for k, v in sorted(self.overrides.items())})

    def _persist(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        settings = {k: _to_json(v) for k, v in sorted(self.overrides.items())}
        write_json_atomic(self.path, {"settings": settings})

    def entries(self) -> list[Entry]:
        """Every plain setting of the broker and its store, the changeable ones first."""
        out = []
        for obj in (self.broker, self.store):
            for f in dataclasses.fields(obj):
                if f.name in _HIDDEN or not f.repr:
                    continue
                value = getattr(obj, f.name)
                file_value = self.file_values.get(f.name, value)
                out.append(Entry(f.name, _text(value), _text(file_value), f.name in CHANGEABLE))
        out.sort(key=lambda e: (not e.changeable, e.key))
        return out
