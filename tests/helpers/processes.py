"""Run Python in a child process, for tests that need a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_python(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run this interpreter with ``args`` (and ``stdin`` on its standard input); the
    environment is ours updated by ``env``."""
    return subprocess.run(
        [sys.executable, *args],
        env={**os.environ, **(env or {})},
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def python_path(*directories: Path | str) -> str:
    """``PYTHONPATH`` for a child: ``directories``, then ours (which may name the
    checkout under test ahead of an installed GraphMend), made absolute: the child may
    start in another directory, or in none (a deleted one)."""
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join(
        [*map(str, directories), *(os.path.abspath(entry) for entry in inherited if entry)]
    )


def offline_model_environment(scratch: Path) -> dict[str, str]:
    """For a child that builds transformers models: offline, its own dynamic-module
    cache (``trust_remote_code``) and GraphMend cache under ``scratch``."""
    return {
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(scratch / "hf_modules"),
        "GRAPHMEND_CACHE_DIR": str(scratch / "cache"),
    }
