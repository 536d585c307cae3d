"""The README's example failover test, run as written: users copy it."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_example_passes() -> None:
    section = README.read_text().split("## Deployment", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "the README's deployment section has a Python example"
    namespace: dict[str, object] = {}
    exec(compile(match.group(1), str(README), "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    assert len(tests) == 1
    tests[0]()
