"""Import overhead of GraphMend: plain import vs the hook with a warm and a cold cache.

Each measurement is a fresh process that imports torch and transformers (not
claimed by GraphMend), then the target modeling modules (claimed, along with
what they pull in, e.g. ``transformers.modeling_utils``).  The three arms run
interleaved, round after round, so that machine noise hits them alike; ratios
are taken per round against the plain import of the same round.

    python bench/import_overhead.py [--rounds 9] [--module NAME ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import environment

DEFAULT_MODULES = ["transformers.models.llama.modeling_llama"]
ARMS = ("plain", "warm", "cold")

CHILD = r"""
import importlib, json, sys, time
arm, modules = sys.argv[1], sys.argv[2:]
started = time.perf_counter()
import torch, transformers
prerequisites = time.perf_counter()
if arm != "plain":
    import graphmend
    graphmend.install()
for name in modules:
    importlib.import_module(name)
done = time.perf_counter()
print(json.dumps({"total": done - started, "claimed": done - prerequisites}))
"""


def measure(arm: str, modules: list[str], cache_dir: str) -> dict[str, float]:
    env = {**os.environ, "GRAPHMEND_CACHE_DIR": cache_dir}
    env.pop("GRAPHMEND", None)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, arm, *modules],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(child.stdout.strip().splitlines()[-1])


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, median, high


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--module", action="append", dest="modules")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    modules = options.modules or DEFAULT_MODULES

    samples: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as scratch:
        warm_dir = str(Path(scratch) / "warm")
        measure("warm", modules, warm_dir)  # fills the warm cache
        for round_index in range(options.rounds):
            order = ARMS[round_index % 3 :] + ARMS[: round_index % 3]
            for arm in order:
                cache_dir = (
                    warm_dir if arm != "cold" else tempfile.mkdtemp(dir=scratch, prefix="cold")
                )
                samples[arm].append(measure(arm, modules, cache_dir))
            print(f"round {round_index + 1}/{options.rounds} done", file=sys.stderr)

    import torch
    import transformers

    print(
        f"import of {', '.join(modules)}\n"
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {options.rounds} rounds\n"
    )
    report: dict[str, dict[str, object]] = {}
    for part, label in (
        ("claimed", "modeling modules (after torch + transformers)"),
        ("total", "whole process import"),
    ):
        print(f"{label}:")
        header = ("arm", "median ms", "IQR ms", "ratio vs plain", "ratio IQR")
        print("  {:<6} {:>10} {:>17} {:>15} {:>15}".format(*header))
        for arm in ARMS:
            times = [sample[part] * 1000 for sample in samples[arm]]
            ratios = [
                sample[part] / plain[part]
                for sample, plain in zip(samples[arm], samples["plain"], strict=True)
            ]
            low, median, high = quartiles(times)
            r_low, r_median, r_high = quartiles(ratios)
            print(
                f"  {arm:<6} {median:>10.0f} {f'{low:.0f}-{high:.0f}':>17} "
                f"{r_median:>15.2f} {f'{r_low:.2f}-{r_high:.2f}':>15}"
            )
            report.setdefault(part, {})[arm] = {
                "median_ms": median,
                "iqr_ms": [low, high],
                "ratio_median": r_median,
                "ratio_iqr": [r_low, r_high],
            }
        print()
    if options.json:
        meta = {**environment(), "rounds": options.rounds}
        options.json.write_text(
            json.dumps({"meta": meta, "modules": modules, "results": report}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
