"""Running the docs' Python examples as written: users copy them."""

from __future__ import annotations

import re
from pathlib import Path


def run_documented_test(doc: Path, after: str) -> None:
    """Run the one ``test_*`` function of the first Python block after ``after`` in ``doc``."""
    section = doc.read_text().split(after, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, f"{doc.name} has a Python example after {after!r}"
    namespace: dict[str, object] = {}
    exec(compile(match.group(1), str(doc), "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    assert len(tests) == 1
    tests[0]()
