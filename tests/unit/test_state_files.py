"""A broker's state files read strictly: a damaged file and backup, or valid JSON of the wrong
shape, is a StateFileError naming the file, what is wrong (line and column, or the key and what
was expected) and the repair command; never a silent empty table or an AttributeError. A damaged
newest version with a good backup loads the backup."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tidemq.replication.epochs import EpochFile, EpochFileError
from tidemq.services.broker import repair
from tidemq.services.broker.config import load as load_broker_config
from tidemq.services.broker.groups import SubscriptionGroupManager
from tidemq.services.broker.offsets import OffsetManager
from tidemq.services.broker.topics import TopicConfig, TopicManager
from tidemq.storage.errors import ConfigError
from tidemq.storage.state_file import StateFileError, move_aside

Manager = Callable[[str], object]
FILES: dict[str, tuple[str, Manager]] = {
    "offsets": ("consumerOffset.json", OffsetManager),
    "topics": ("topics.json", TopicManager),
    "groups": ("subscriptionGroup.json", SubscriptionGroupManager),
}


def write(root: Path, name: str, text: str, *, backup: str | None = None) -> Path:
    path = root / "config" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if backup is not None:
        Path(f"{path}.bak").write_text(backup)
    return path


@pytest.mark.parametrize("kind", sorted(FILES))
def test_a_damaged_file_and_backup_refuse_with_the_file_the_line_and_the_fix(
    tmp_path: Path, kind: str
) -> None:
    name, manager = FILES[kind]
    path = write(tmp_path, name, '{"a": 1,\n  "b": }\n', backup="")
    with pytest.raises(StateFileError) as e:
        manager(str(tmp_path))
    message = str(e.value)
    assert e.value.path == str(path)
    assert message.startswith(f"{path}: not valid JSON: ")
    assert "at line 2, column 8" in message
    assert f"its backup {name}.bak: empty file" in message
    assert f"repair-state --store {tmp_path}" in message and f"--reset {kind}" in message
    assert not e.value.retriable


@pytest.mark.parametrize(
    ("kind", "text", "says"),
    [
        ("offsets", "[]", "the top level: expected an object (OffsetFile), got list"),
        (
            "offsets",
            '{"offsetTable": {"t@g": {"0": "42"}}}',
            "'offsetTable'['t@g']['0']: expected an integer",
        ),
        ("offsets", '{"offsetTable": {"t@g": {"zero": 4}}}', 'expected an integer key, got "zero"'),
        ("offsets", '{"offsetTable": {"t@g": [1]}}', "'offsetTable'['t@g']: expected an object"),
        ("offsets", '{"topics": []}', "'offsetTable': expected a value (the key is missing)"),
        ("offsets", '{"offsetTable": {"no-at-sign": {"0": 1}}}', "expected a 'topic@group' key"),
        ("offsets", '{"offsetTable": {"t@g": {"0": -5}}}', "expected a number >= 0, got -5"),
        ("topics", '{"topics": {"orders": 8}}', "'topics': expected a list"),
        (
            "topics",
            '{"topics": [{"read_queue_nums": 8}]}',
            "'topics'[0]['topic']: expected a value",
        ),
        (
            "topics",
            '{"topics": [{"topic": "t", "perm": true}]}',
            "['perm']: expected an integer, got true",
        ),
        (
            "topics",
            '{"topics": [{"topic": "t", "read_queue_nums": 0}]}',
            "'topics'[0] ('t'): read_queue_nums must be 1..1024",
        ),
        ("topics", '{"topics": [], "data_version": 3}', "'data_version': expected an object"),
        ("groups", '{"groups": [{"group": "g"}]}', "'groups'[0]['mode']: expected a value"),
        (
            "groups",
            '{"groups": [{"group": "g", "mode": 1, "topics": "orders"}]}',
            "['topics']: expected a list",
        ),
    ],
)
def test_valid_json_of_the_wrong_shape_names_the_key_and_what_was_expected(
    tmp_path: Path, kind: str, text: str, says: str
) -> None:
    name, manager = FILES[kind]
    path = write(tmp_path, name, text)
    with pytest.raises(StateFileError) as e:
        manager(str(tmp_path))
    assert str(e.value).startswith(f"{path}: wrong shape: ")
    assert says in str(e.value)
    assert "its backup" in str(e.value) and "missing" in str(e.value)


def test_a_damaged_newest_version_loads_its_backup(tmp_path: Path) -> None:
    om = OffsetManager(str(tmp_path))
    om.commit("g", "t", 0, 5)
    om.persist()
    om.commit("g", "t", 0, 9)
    om.persist()  # the first version is now the .bak
    (tmp_path / "config" / "consumerOffset.json").write_text("{torn")
    assert OffsetManager(str(tmp_path)).query("g", "t", 0) == 5


def test_no_files_at_all_is_a_new_broker_with_empty_tables(tmp_path: Path) -> None:
    assert OffsetManager(str(tmp_path)).entries() == []
    assert TopicManager(str(tmp_path)).all() == []
    assert SubscriptionGroupManager(str(tmp_path)).all() == []


def test_files_written_before_versioned_offsets_still_load(tmp_path: Path) -> None:
    """consumerOffset.json with the old commitTimestamps table, and topics as they are written."""
    write(
        tmp_path,
        "consumerOffset.json",
        json.dumps(
            {"offsetTable": {"t@g": {"0": 42}}, "commitTimestamps": {"t@g": {"0": 1700000000000}}}
        ),
    )
    assert OffsetManager(str(tmp_path)).query("g", "t", 0) == 42
    TopicManager(str(tmp_path)).upsert(TopicConfig("orders", 4, 4, attributes={"a": "b"}))
    assert TopicManager(str(tmp_path)).get("orders") == TopicConfig(
        "orders", 4, 4, attributes={"a": "b"}
    )


def test_a_damaged_epoch_file_and_backup_name_the_file_and_the_fix(tmp_path: Path) -> None:
    f = EpochFile(tmp_path)
    f.append(1, 0)
    f.append(2, 100)
    (tmp_path / "epochs").write_bytes(b"garbage")
    (tmp_path / "epochs.bak").write_bytes(b"2\n1\n1-0\n")
    with pytest.raises(StateFileError) as e:
        EpochFile(tmp_path)
    assert isinstance(e.value, EpochFileError)
    assert str(e.value).startswith(
        f"{tmp_path / 'epochs'}: bad header (its backup epochs.bak: CRC mismatch (torn write?))"
    )
    assert f"repair-state --store {tmp_path} --reset epochs" in str(e.value)


def test_moving_aside_keeps_the_file_and_its_backup_under_new_names(tmp_path: Path) -> None:
    path = write(tmp_path, "topics.json", "bad", backup="older")
    moved = move_aside(str(path))
    assert not path.exists() and not Path(f"{path}.bak").exists()
    assert sorted(Path(m).read_text() for m in moved) == ["bad", "older"]
    assert all(".corrupt-" in Path(m).name for m in moved)
    write(tmp_path, "topics.json", "bad again")
    (again,) = move_aside(str(path))  # the same second: a distinct name, nothing overwritten
    assert again not in moved and Path(again).read_text() == "bad again"


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        (
            'broker_name = "a"\nbroker_id = \n',
            "not valid TOML: Invalid value (at line 2, column 13)",
        ),
        ('broker_id = "one"\n', "'broker_id': expected an integer, got \"one\""),
        ("replication = 5\n", "'replication' must be a table"),
        (
            '[replication]\nchunk_bytes = "big"\n',
            "'replication'['chunk_bytes']: expected an integer",
        ),
        ('role = "boss"\n', "'role': expected one of ASYNC_MASTER, SYNC_MASTER, SLAVE"),
        ("nameservers = 5\n", "'nameservers': expected a list"),
    ],
)
def test_a_bad_broker_config_file_is_a_config_error_naming_the_file_and_the_key(
    tmp_path: Path, toml: str, says: str
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as e:
        load_broker_config(str(path), {"store_dir": str(tmp_path / "store")})
    assert str(e.value).startswith(f"broker config {path}: ")
    assert says in str(e.value)


def test_repair_reset_moves_the_file_aside_and_rebuilds_topics_from_the_stores_queues(
    tmp_path: Path,
) -> None:
    for topic, queues in (("orders", 4), ("audit", 1)):
        for q in range(queues):
            (tmp_path / "consumequeue" / topic / str(q)).mkdir(parents=True)
    write(tmp_path, "topics.json", '{"topics": 3}', backup="")
    assert [f.kind for f in repair.check(str(tmp_path)) if f.problem] == ["topics"]
    done = repair.reset(str(tmp_path), "topics")
    assert any("rebuilt 2 topics" in line for line in done), done
    assert [
        (t.topic, t.read_queue_nums, t.write_queue_nums) for t in TopicManager(str(tmp_path)).all()
    ] == [
        ("audit", 1, 1),
        ("orders", 4, 4),
    ]
    assert len(list((tmp_path / "config").glob("topics.json*.corrupt-*"))) == 2
    assert not [f for f in repair.check(str(tmp_path)) if f.problem]
