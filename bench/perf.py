"""Compile time and latency with and without GraphMend, side by side.

For each model (by default: the census models whose plain run breaks the graph,
those where GraphMend removes the most breaks first), both arms run in their own
processes, each with a fresh TorchInductor cache:

* time to first compiled result (compile included, cold start),
* compile time (first call minus a steady call),
* graphs compiled,
* steady-state latency of the compiled model (median of many calls after warm-up),
* eager latency (the cost of the check at each rewritten site),
* on CUDA with ``--mode reduce-overhead``: the CUDA graphs recorded and the
  compiles that CUDA graphs had to skip.

The arms alternate their order from model to model and the pair is repeated
(``--repeats``); ratios GraphMend/plain are taken per repetition and reported
as median and range.  The same weights and inputs serve both arms (the census
builders, saved by the first arm, loaded strictly by the second).

    python bench/perf.py [--census bench/results/census-X/census.json] [--models a,b]
                         [--device cpu|cuda] [--dtype float32|float16|bfloat16]
                         [--mode default|reduce-overhead]
                         [--repeats 3] [--calls 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import environment

HERE = Path(__file__).resolve().parent
ARMS = ("plain", "graphmend")
METRICS = ("first_result_s", "compile_s", "graphs", "compiled_ms", "eager_ms")
CUDA_METRICS = ("cuda_graphs", "cudagraph_skips")


def measure_arm(options: dict[str, Any]) -> dict[str, Any]:
    """Run in a child process: build (or rebuild) the model, compile it, time it."""
    import torch

    if options["arm"] == "graphmend":
        import graphmend

        graphmend.install()
    sys.path.insert(0, str(HERE))
    from torch._dynamo.utils import counters

    from census import choose_subject, rebuild_subject
    from measuring import cast

    state = Path(options["state"])
    if options["model_type"].startswith(REMOTE):
        subject = remote_subject(options["model_type"].removeprefix(REMOTE), state)
    elif state.exists():
        subject = rebuild_subject(options["model_type"], options["choice"], state)
    else:
        subject, _ = choose_subject(options["model_type"])
        torch.save({"state_dict": subject.model.state_dict(), "inputs": subject.inputs}, state)
    device = torch.device(options["device"])
    dtype = getattr(torch, options["dtype"])
    model = subject.model.eval().to(device, dtype)
    inputs = {name: value.to(device) for name, value in cast(subject.inputs, dtype).items()}
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed_calls(function: Any, calls: int) -> float:
        samples = []
        for _ in range(calls):
            synchronize()
            started = time.perf_counter()
            function(**inputs)
            synchronize()
            samples.append(time.perf_counter() - started)
        return statistics.median(samples) * 1000

    result: dict[str, Any] = {"choice": subject.choice}
    with torch.no_grad():
        eager_ms = timed_calls(model, options["calls"])
        compiled = torch.compile(model, mode=options["mode"])
        counters.clear()
        synchronize()
        started = time.perf_counter()
        compiled(**inputs)
        synchronize()
        first = time.perf_counter() - started
        for _ in range(3):  # warm-up (CUDA graphs record on the second or third call)
            compiled(**inputs)
        compiled_ms = timed_calls(compiled, options["calls"])
    result.update(
        first_result_s=first,
        compile_s=first - compiled_ms / 1000,
        graphs=counters["stats"]["unique_graphs"],
        compiled_ms=compiled_ms,
        eager_ms=eager_ms,
        cudagraph_skips=sum(
            counters["inductor"].get(key, 0)
            for key in counters["inductor"]
            if "cudagraph_skip" in key
        ),
    )
    if device.type == "cuda" and options["mode"] == "reduce-overhead":
        result["cuda_graphs"] = cuda_graphs_recorded(device.index or 0)
    return result


#: A model type naming a family of ``bench/remote_corpus`` (``remote:chatglm3``).
REMOTE = "remote:"


def remote_subject(family: str, state: Path) -> Any:
    """A ``trust_remote_code`` model of the corpus and its inputs; the first arm saves
    weights and inputs, the second loads them strictly."""
    import types

    import torch

    from remote_corpus import build, inputs_for, load_manifest, unfetched

    manifest = load_manifest()
    problem = unfetched([family], manifest)
    if problem:
        raise SystemExit(problem)
    model = build(family, manifest[family])
    if state.exists():
        saved = torch.load(state)
        model.load_state_dict(saved["state_dict"], strict=True)
        inputs = saved["inputs"]
    else:
        inputs = inputs_for(model)
        torch.save({"state_dict": model.state_dict(), "inputs": inputs}, state)
    return types.SimpleNamespace(model=model, inputs=inputs, choice={"family": family})


def cuda_graphs_recorded(device_index: int) -> int:
    """How many CUDA graphs TorchInductor's CUDA-graph trees recorded (-1: unknown)."""
    try:
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_container(device_index).tree_manager
        # the id the next graph would get: the number recorded so far
        return 0 if manager is None else manager.graph_counter.__reduce__()[1][0]
    except Exception:
        return -1


def run_arm(arm: str, model_type: str, choice: dict | None, state: Path, options) -> dict:
    """One arm in a fresh process with a fresh TorchInductor cache."""
    with tempfile.TemporaryDirectory() as inductor_cache:
        payload = {
            "arm": arm,
            "model_type": model_type,
            "choice": choice,
            "state": str(state),
            "device": options.device,
            "dtype": options.dtype,
            "mode": options.mode,
            "calls": options.calls,
        }
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": inductor_cache,
            "HF_HUB_OFFLINE": "1",
            "GRAPHMEND_CACHE_DIR": str(Path(inductor_cache) / "graphmend"),
            # remote code is copied here and imported from here (through the hook)
            "HF_MODULES_CACHE": str(Path(inductor_cache) / "hf_modules"),
        }
        env.pop("GRAPHMEND", None)
        child = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(payload)],
            env=env,
            capture_output=True,
            text=True,
            timeout=options.timeout,
        )
    if child.returncode != 0:
        return {"error": (child.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(child.stdout.strip().splitlines()[-1])


def models_with_breaks(census: Path, dtype: str) -> list[str]:
    """Model types whose plain arm breaks the graph in ``dtype``, from a census JSON:
    those where GraphMend removes the most breaks first."""
    data = json.loads(census.read_text())
    removed = {}
    for result in data["models"]:
        arms = result.get("arms", {})
        before, after = (
            (arms.get(arm, {}).get("runs", {}).get(dtype) or {}).get("breaks") for arm in ARMS
        )
        if before and after is not None:
            removed[result["model_type"]] = (before - after, before)
    return sorted(removed, key=lambda model_type: removed[model_type], reverse=True)


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--census", type=Path)
    parser.add_argument(
        "--models",
        help="comma-separated model types, or remote:FAMILY for a family of "
        "bench/remote_corpus (default: from --census)",
    )
    parser.add_argument("--limit", type=int, default=8, help="at most this many models")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--mode", default="default", choices=["default", "reduce-overhead"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(measure_arm(json.loads(options.child))))
        return 0
    if options.models:
        models = [m.strip() for m in options.models.split(",") if m.strip()]
    elif options.census:
        models = models_with_breaks(options.census, options.dtype)[: options.limit]
    else:
        parser.error("give --models or --census")

    import torch
    import transformers

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {options.device}, {options.dtype}, mode {options.mode}, "
        f"{options.repeats} repeats, {options.calls} timed calls, {os.cpu_count()} CPUs"
    )
    meta = {
        **environment(),
        **{key: getattr(options, key) for key in ("device", "dtype", "mode", "repeats", "calls")},
    }
    report: dict[str, Any] = {"meta": meta, "models": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for index, model_type in enumerate(models):
            samples: dict[str, list[dict]] = {arm: [] for arm in ARMS}
            state = Path(scratch) / f"{model_type}.pt"
            choice = None
            for repeat in range(options.repeats):
                order = ARMS if (index + repeat) % 2 == 0 else ARMS[::-1]
                for arm in order:
                    outcome = run_arm(arm, model_type, choice, state, options)
                    choice = outcome.get("choice", choice)
                    samples[arm].append(outcome)
            report["models"][model_type] = samples
            print_model(model_type, samples)
    if options.json:
        options.json.write_text(json.dumps(report, indent=1))
    return 0


def print_model(model_type: str, samples: dict[str, list[dict]]) -> None:
    errors = [s["error"] for arm in ARMS for s in samples[arm] if "error" in s]
    if errors:
        print(f"\n{model_type}: failed: {errors[0]}")
        return
    print(f"\n{model_type}")
    print(f"  {'metric':<22}{'plain (median)':>16}{'graphmend (median)':>20}{'ratio gm/plain':>26}")
    for metric in METRICS + tuple(m for m in CUDA_METRICS if m in samples["plain"][0]):
        plain = [s[metric] for s in samples["plain"]]
        mended = [s[metric] for s in samples["graphmend"]]
        ratios = [m / p for m, p in zip(mended, plain, strict=True) if p]
        print(
            f"  {metric:<22}{statistics.median(plain):>16.3f}{statistics.median(mended):>20.3f}"
            f"{spread(ratios):>26}"
        )


if __name__ == "__main__":
    sys.exit(main())
