"""What pip installs is one import package, ``tidemq``, and its layers point one way: the import
contracts of pyproject.toml (``make lint``) bite, and the SDK loads no server code."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tidemq"
# The design card's top-level folders, installed as tidemq.<name> through links in tidemq/.
LINKED = ("storage", "services", "replication", "protos", "pipeline")
SERVER_PACKAGES = ("tidemq.storage", "tidemq.services", "tidemq.replication", "tidemq.pipeline")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.deploy


def _contracts() -> list[dict[str, Any]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        contracts: list[dict[str, Any]] = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return contracts


def _client_contract() -> dict[str, Any]:
    (client,) = [c for c in _contracts() if str(c["name"]).startswith("The client layer")]
    return client


def test_the_top_level_folders_are_the_tidemq_subpackages() -> None:
    for name in LINKED:
        link = PACKAGE / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), name
        assert (link / "__init__.py").is_file(), name


def test_every_client_module_is_bound_by_the_client_contract() -> None:
    """A module added to tidemq/ outside the server folders is client code: the contract that
    keeps it off the server packages must name it."""
    modules = {
        f"tidemq.{p.stem}"
        for p in PACKAGE.iterdir()
        if p.name not in LINKED
        and p.name not in ("__init__.py", "__pycache__")
        and (p.suffix == ".py" or (p / "__init__.py").is_file())
    }
    assert modules == set(_client_contract()["source_modules"])


def test_importing_the_sdk_loads_no_server_code_nor_spark() -> None:
    code = (
        "import sys, tidemq\n"
        "from tidemq import *\n"
        "import tidemq.cli, tidemq.testing\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    loaded = done.stdout.split()
    assert "tidemq.producer" in loaded and "tidemq.testing" in loaded
    server = [m for m in loaded if m.startswith(SERVER_PACKAGES) or m.split(".")[0] == "pyspark"]
    assert server == []


def _lint_copy(tmp_path: Path, contract: str, edits: dict[str, str]) -> int:
    """lint-imports' exit code for one contract over a copy of the package with ``edits`` (path
    -> line appended)."""
    shutil.copytree(PACKAGE, tmp_path / "tidemq", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for path, line in edits.items():
        with open(tmp_path / path, "a") as f:
            f.write(f"\n{line}\n")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--contract", contract],
        capture_output=True,
        check=False,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    ).returncode


def test_the_import_contracts_hold() -> None:
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in done.stdout


@pytest.mark.parametrize(
    ("contract", "path", "line"),
    [
        ("client", "tidemq/types.py", "import tidemq.storage.record"),
        ("sdk-root", "tidemq/types.py", "import tidemq.services.errors"),
        ("storage", "tidemq/storage/crc.py", "import tidemq.errors"),
        ("protos", "tidemq/protos/errors.py", "import tidemq.types"),
        ("replication", "tidemq/replication/log.py", "import tidemq.services.errors"),
        ("services", "tidemq/services/errors.py", "import tidemq.pipeline.schema"),
        ("pipeline", "tidemq/pipeline/sink.py", "import tidemq.storage.store"),
    ],
)
def test_a_wrong_arrow_fails_the_lint(tmp_path: Path, contract: str, path: str, line: str) -> None:
    assert _lint_copy(tmp_path / "kept", contract, {}) == 0
    assert _lint_copy(tmp_path / "broken", contract, {path: line}) != 0


def test_the_wheel_installs_one_top_level_package(tmp_path: Path) -> None:
    # Built from a copy (links kept as links), so that setuptools' build/ directory, with
    # whatever an earlier build left in it, stays out of the checkout and out of this wheel.
    source = tmp_path / "source"
    for name in ("tidemq", *LINKED):
        shutil.copytree(
            ROOT / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*pip_wheel, "-w", str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("tidemq-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert z.read(info).decode().split() == ["tidemq"]
        commands = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert {n.split("/")[0] for n in names if not n.startswith("tidemq-")} == {"tidemq"}
    # The linked folders arrive as ordinary files under tidemq/, the .proto sources with them.
    for member in (
        "tidemq/storage/record/__init__.py",
        "tidemq/services/broker/server.py",
        "tidemq/replication/master.py",
        "tidemq/protos/broker.proto",
        "tidemq/pipeline/source.py",
    ):
        assert member in names
    for command in ("broker", "console", "dev", "nameserver", "pipeline", "store"):
        assert f"\n{command} = tidemq." in commands
