"""The README's example failover test, run as written: users copy it."""

from __future__ import annotations

from pathlib import Path

from tests.containers.documented import run_documented_test

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_example_passes() -> None:
    run_documented_test(README, "## Deployment")
