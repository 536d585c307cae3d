"""Storage benchmark case 6: ``ceiling``: perfkit's ``mmap_append.py`` with the same size, runs
and environment, the machine's mmap append ceiling the store's append is compared with. Part of
``store_bench.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from store_common import Record, log


def ceiling(perfkit: str, gib: float, runs: int, scratch: str) -> Record | None:
    perfkit = os.path.abspath(perfkit)
    script = os.path.join(perfkit, "mmap_append.py")
    if not os.path.exists(script):
        log(f"no {script}: the ceiling is skipped")
        return None
    env = dict(os.environ)
    env.setdefault("PERFKIT_TMP", os.path.join(scratch, "perfkit"))  # same filesystem as ours
    cmd = [sys.executable, script, "--gib", str(gib), "--runs", str(runs)]
    t = time.perf_counter()
    p = subprocess.run(
        cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=perfkit, timeout=1800, check=False
    )
    wall = time.perf_counter() - t
    out: Record = {"script": script, "args": cmd[2:], "wall_s": wall, "returncode": p.returncode}
    for line in p.stdout.splitlines():
        if not line.startswith("RESULT "):
            continue
        r = json.loads(line[len("RESULT ") :])
        if r.get("bench") == "mmap.append_1KiB" and r.get("mode") == "pack+crc32":
            out[f"pack_crc32_{r['pass_']}_recs_per_s"] = r["recs_per_s"]
            out[f"pack_crc32_{r['pass_']}_recs_per_s_runs"] = r["recs_per_s_runs"]
            out[f"pack_crc32_{r['pass_']}_load1"] = r.get("load1")
        elif r.get("bench") == "mmap.append_1KiB":
            out[f"{r['mode']}_{r['pass_']}_recs_per_s"] = r["recs_per_s"]
    if "pack_crc32_cold_recs_per_s" not in out:
        log(f"ceiling: no pack+crc32 result (rc {p.returncode})")
    return out
