"""Import every ``transformers.models.*.modeling_*`` module with and without GraphMend.

Checks the contract "never break an import": under the hook, a module must
import exactly where it imports without it.  Each arm runs in its own
processes (``--jobs`` shards the module list), with a cold GraphMend cache.

    python bench/import_all_models.py [--jobs 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import importlib, json, sys, traceback, warnings
arm, names = sys.argv[1], sys.argv[2:]
if arm == "graphmend":
    import graphmend
    graphmend.install()
results = {}
for name in names:
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(name)
        gm_warnings = [str(w.message) for w in caught if w.category.__name__ == "GraphMendWarning"]
        loader = type(getattr(module, "__loader__", None)).__name__
        results[name] = {"ok": True, "loader": loader, "warnings": gm_warnings}
    except BaseException as error:
        results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"[:300]}
print(json.dumps(results))
"""


def modeling_modules() -> list[str]:
    import transformers

    root = Path(transformers.__file__).parent / "models"
    return sorted(
        f"transformers.models.{path.parent.name}.{path.stem}"
        for path in root.glob("*/modeling_*.py")
    )


def run_arm(arm: str, modules: list[str], jobs: int, env: dict[str, str]) -> dict[str, dict]:
    shards = [modules[index::jobs] for index in range(jobs)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, arm, *shard],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for shard in shards
        if shard
    ]
    results: dict[str, dict] = {}
    for child in children:
        stdout, _ = child.communicate()
        results.update(json.loads(stdout.strip().splitlines()[-1]))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", help="substring filter on module names")
    parser.add_argument("--json", type=Path, help="write per-module results here")
    options = parser.parse_args()

    import transformers

    modules = [m for m in modeling_modules() if not options.only or options.only in m]
    print(f"transformers {transformers.__version__}: {len(modules)} modeling modules")
    outcome = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "GRAPHMEND_CACHE_DIR": cache, "HF_HUB_OFFLINE": "1"}
        env.pop("GRAPHMEND", None)
        for arm in ("plain", "graphmend"):
            started = time.perf_counter()
            outcome[arm] = run_arm(arm, modules, options.jobs, env)
            elapsed = time.perf_counter() - started
            imported = sum(result["ok"] for result in outcome[arm].values())
            print(f"{arm:>9}: {imported}/{len(modules)} import ({elapsed:.0f} s)")
    plain, mended = outcome["plain"], outcome["graphmend"]
    differ = [m for m in modules if plain[m]["ok"] != mended[m]["ok"]]
    claimed = sum(1 for m in modules if mended[m].get("loader") == "GraphMendLoader")
    fell_back = [m for m in modules if mended[m].get("warnings")]
    print(f"same outcome with and without GraphMend: {len(modules) - len(differ)}/{len(modules)}")
    print(f"loaded by GraphMend's loader: {claimed}; fell back with a warning: {len(fell_back)}")
    for name in differ:
        print(f"  DIFFERENT {name}: plain={plain[name]} graphmend={mended[name]}")
    for name in fell_back:
        print(f"  fell back {name}: {mended[name]['warnings']}")
    if options.json:
        options.json.write_text(json.dumps(outcome, indent=1))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
