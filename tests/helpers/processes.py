"""Run Python in a child process, for tests that need a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_python(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run this interpreter with ``args``; the environment is ours updated by ``env``."""
    return subprocess.run(
        [sys.executable, *args],
        env={**os.environ, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
