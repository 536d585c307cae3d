"""``retain_freed_memory``: a broker's megabyte answers come from memory the process keeps,
not from fresh mappings the kernel must fault in and zero on every call. Checked in a child
process (the settings are the whole process's) through glibc's own accounting (mallinfo2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tidemq.services.allocator import retain_freed_memory

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    from tidemq.services.allocator import retain_freed_memory

    took = retain_freed_memory(int(sys.argv[1]))
    slices = [bytes(32 << 10) for _ in range(128)]  # a pull's answer, encoded slice by slice
    faults = []  # pages the kernel faulted in (and zeroed) for each call's buffers
    for _ in range(6):  # a call: the answer joined, copied on its way out, then all freed
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        answer = b"".join(slices)
        sent = bytes(bytearray(answer))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del answer, sent
    print(json.dumps({"took": took, "faults": faults}))
    """
)


def run_child(retain_bytes: int, **malloc_env: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(retain_bytes)],
        env={**env, **malloc_env},
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    answer: dict[str, object] = json.loads(out)
    return answer


def test_megabyte_buffers_reuse_kept_memory_instead_of_faulting_in_fresh_pages() -> None:
    defaults = run_child(0)
    tuned = run_child(256 << 20)
    pages = 3 * (4 << 20) // 4096  # the answer, the copy and the copy's staging buffer
    # With the C library's defaults the freed buffers go back to the kernel, and every call's
    # buffers are faulted in page by page again: what this setting exists to avoid.
    assert defaults["took"] is False
    assert min(defaults["faults"][1:]) >= pages // 2, defaults  # type: ignore[index]
    assert tuned["took"] is True
    assert max(tuned["faults"][1:]) < pages // 20, tuned  # type: ignore[index]


def test_an_operators_malloc_setting_in_the_environment_wins() -> None:
    # glibc read it at start-up: trimming everything freed back to the kernel at once.
    kept = run_child(256 << 20, MALLOC_TRIM_THRESHOLD_="0")
    pages = 3 * (4 << 20) // 4096
    assert min(kept["faults"][1:]) >= pages // 2, kept  # type: ignore[index]


def test_a_negative_amount_is_refused() -> None:
    with pytest.raises(ValueError, match="retain_bytes must be >= 0"):
        retain_freed_memory(-1)
