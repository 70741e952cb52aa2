"""What the graphmend_hook.pth shim costs a Python process.

With ``GRAPHMEND`` unset, the shim is one line executed by ``site``: an
environment lookup.  This script shows (1) with ``python -X importtime`` that
no GraphMend module is imported then, (2) the cost of executing the .pth line,
timed directly, and (3) with ``GRAPHMEND=1``, the import time of the shim and of
the ``graphmend`` package it installs.

    python bench/startup_cost.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import timeit
from pathlib import Path


def importtime(env: dict[str, str]) -> dict[str, tuple[int, int]]:
    child = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    times = {}
    for line in child.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|\s+(.*)$", line)
        if match:
            times[match.group(3).strip()] = (int(match.group(1)), int(match.group(2)))
    return times


def main() -> int:
    pth = Path(sysconfig.get_paths()["purelib"]) / "graphmend_hook.pth"
    if not pth.exists():
        print(f"{pth} is missing: is graphmend installed in this interpreter?")
        return 1
    line = pth.read_text().strip()
    env = {key: value for key, value in os.environ.items() if key != "GRAPHMEND"}

    unset = importtime(env)
    ours = sorted(name for name in unset if "graphmend" in name)
    print(f"GRAPHMEND unset: modules from GraphMend imported at startup: {ours or 'none'}")

    namespace: dict[str, object] = {}
    number = 200_000
    seconds = min(timeit.repeat(lambda: exec(line, namespace), number=number, repeat=5))
    print(f"GRAPHMEND unset: executing the .pth line costs {seconds / number * 1e6:.2f} µs")

    active = importtime({**env, "GRAPHMEND": "1"})
    for name in ("graphmend_hook", "graphmend"):
        if name in active:
            cumulative = active[name][1]
            print(f"GRAPHMEND=1: import {name}: {cumulative / 1000:.1f} ms cumulative")
    return 0


if __name__ == "__main__":
    sys.exit(main())
