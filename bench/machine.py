"""What a measurement ran on: versions, machine and date, recorded with each result."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def environment() -> dict[str, Any]:
    """torch, transformers and Python versions, CPUs, GPU (if any), date and command."""
    import torch

    return {
        "transformers": importlib.metadata.version("transformers"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([*_settings(), _command()]),
    }


def _command() -> str:
    return shlex.join(["python", Path(sys.argv[0]).as_posix(), *sys.argv[1:]])


def _settings() -> list[str]:
    """``GRAPHMEND_*`` variables set for the run, as a shell would prefix them."""
    return [
        f"{name}={shlex.quote(value)}"
        for name, value in sorted(os.environ.items())
        if name.startswith("GRAPHMEND_") and name != "GRAPHMEND_CACHE_DIR"
    ]
