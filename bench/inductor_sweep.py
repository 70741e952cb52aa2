"""TorchInductor sweep: plain vs GraphMend ``torch.compile`` (Inductor) on transformers models.

The census counts breaks with backend "eager"; this runs the compiled model for
real under TorchInductor, so defects only Inductor shows (lowering errors,
wrong values) surface.  Each model type is built like the census does (tiny
config, seeded random weights, generic inputs) and measured in two processes,
plain then after ``graphmend.install()``, with the same weights and inputs.
In each arm, in inference: eager, then ``torch.compile`` with Inductor on the
census inputs, on inputs 4 tokens shorter (a recompile with dynamic sizes) and
with an all-ones attention mask (the other side of mask tests), counting graphs
and ``torch.cond`` nodes.  GraphMend's compiled outputs must be within
``max(10 x plain compiled's own error against eager, 1e-5)`` of eager.

    python bench/inductor_sweep.py TYPE[:float32,float16] ... [--out DIR] [--timeout S]

Appends one JSON line per model type to ``DIR/results.jsonl`` (default
``/tmp/inductor``) and prints a summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

BENCH = Path(__file__).resolve().parent
SOURCE = BENCH.parent / "src"
ARMS = ("plain", "graphmend")
SHORTER_BY = 4
Outputs = dict[tuple[str, str], list[tuple[str, torch.Tensor]]]


def input_sets(inputs: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """The census inputs ("main"), token inputs 4 shorter, and an all-ones attention mask."""
    shorter = {
        name: value[:, :-SHORTER_BY]
        if not value.is_floating_point() and value.dim() >= 2 and value.shape[1] > 2 * SHORTER_BY
        else value
        for name, value in inputs.items()
    }
    ones = {
        name: torch.ones_like(value) if "attention_mask" in name else value
        for name, value in inputs.items()
    }
    sets = {"main": inputs}
    for label, variant in (("shorter", shorter), ("mask of ones", ones)):
        if any(variant[name] is not inputs[name] for name in inputs):
            sets[label] = variant
    return sets


def count_nodes(graphs: list[torch.fx.GraphModule], word: str) -> int:
    """Calls whose target's name contains ``word`` in the captured graphs."""
    return sum(
        1
        for graph in graphs
        for node in graph.graph.nodes
        if node.op == "call_function" and word in str(node.target)
    )


def measure_dtype(model: Any, inputs: dict[str, torch.Tensor], dtype: str) -> tuple[dict, Outputs]:
    """Eager and Inductor-compiled outputs on each input set, in one dtype."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from measuring import cast, describe, flat_tensors, forward

    model = model.to(getattr(torch, dtype))
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter)
    run: dict[str, Any] = {"errors": {}, "graphs": {}}
    outputs: Outputs = {}
    start = time.time()
    for label, values in input_sets(cast(inputs, getattr(torch, dtype))).items():
        try:
            outputs[(label, "eager")] = flat_tensors(forward(model, values))
            outputs[(label, "compiled")] = flat_tensors(forward(compiled, values))
        except Exception as error:
            stage = "compiled" if (label, "eager") in outputs else "eager"
            run["errors"][f"{label} {stage}"] = describe(error)
        run["graphs"][label] = counter.frame_count
    run["conds"] = count_nodes(counter.graphs, "cond")
    run["seconds"] = round(time.time() - start, 1)
    return run, outputs


def shared_subject(arm: str, model_type: str, folder: Path) -> Any:
    """This arm's census subject: GraphMend installed first in its arm, the same weights in both.

    The plain arm chooses the subject and saves its weights and inputs in
    ``folder``; both arms rebuild it from there (``strict=True``).
    """
    if arm == "graphmend":
        import graphmend

        graphmend.install()
    sys.path.insert(0, str(BENCH))
    from census import choose_subject, rebuild_subject

    torch.set_num_threads(1)
    if arm == "plain":
        chosen, _ = choose_subject(model_type)
        state = {"state_dict": chosen.model.state_dict(), "inputs": chosen.inputs}
        torch.save(state, folder / "state.pt")
        (folder / "choice.json").write_text(json.dumps(chosen.choice))
    choice = json.loads((folder / "choice.json").read_text())
    return rebuild_subject(model_type, choice, folder / "state.pt")


def run_arm(arm: str, model_type: str, dtypes: list[str], folder: Path) -> dict[str, Any]:
    """One arm in this process: the plain arm chooses and saves the subject, both measure it."""
    subject = shared_subject(arm, model_type, folder)
    result: dict[str, Any] = {"class": subject.choice["class"]}
    outputs: dict[str, Outputs] = {}
    for dtype in dtypes:
        result[dtype], outputs[dtype] = measure_dtype(subject.model, subject.inputs, dtype)
    torch.save(outputs, folder / f"{arm}.pt")
    return result


def max_diff(expected: list, actual: list) -> float | str:
    """Largest absolute difference of two flattened outputs, or what keeps them apart."""
    if [path for path, _ in expected] != [path for path, _ in actual]:
        return "structure"
    worst = 0.0
    for (path, want), (_, got) in zip(expected, actual, strict=True):
        if want.shape != got.shape:
            return f"shape of {path}"
        if want.is_floating_point() and want.numel():
            difference = (want.double() - got.double()).abs().nan_to_num(1e9).max()
            worst = max(worst, float(difference))
        elif not want.is_floating_point() and not torch.equal(want, got):
            return f"values of {path}"
    return worst


def compare(plain: Outputs, mended: Outputs) -> dict[str, dict[str, Any]]:
    """Per input set: each compiled output against plain eager, and the verdict."""
    found: dict[str, dict[str, Any]] = {}
    for label in dict.fromkeys(label for label, _ in plain):
        eager = plain.get((label, "eager"))
        if eager is None:
            continue
        row = {
            f"{name} vs eager": max_diff(eager, source[(label, kind)])
            for name, source, kind in (
                ("plain compiled", plain, "compiled"),
                ("graphmend eager", mended, "eager"),
                ("graphmend compiled", mended, "compiled"),
            )
            if (label, kind) in source
        }
        own, theirs = row.get("plain compiled vs eager"), row.get("graphmend compiled vs eager")
        if isinstance(own, float) and isinstance(theirs, float):
            row["within"] = theirs <= max(10 * own, 1e-5)
        found[label] = row
    return found


def run_subprocess(
    arm: str, arguments: list[str], folder: Path, timeout: int, script: str = __file__
) -> dict[str, Any]:
    """``script --arm ARM ARGUMENTS...`` in a fresh interpreter, its last line read as JSON.

    A fresh interpreter per arm: GraphMend must be installed before transformers is imported.
    """
    env = {**os.environ, "PYTHONPATH": str(SOURCE), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, script, "--arm", arm, *arguments]
    start = time.time()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "wall": timeout}
    (folder / f"{arm}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        return {"status": "crash", "tail": (done.stdout + done.stderr)[-1500:]}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "wall": round(time.time() - start)}


def answer_arm_call(run_arm: Callable[[str, str, list[str], Path], dict[str, Any]]) -> bool:
    """Whether this process is one arm (``--arm ARM TYPE A,B,... FOLDER``, from
    :func:`run_subprocess`); if so, run it and print its record as the last line."""
    if sys.argv[1:2] != ["--arm"]:
        return False
    arm, model_type, listed, folder = sys.argv[2:6]
    print("\n" + json.dumps(run_arm(arm, model_type, listed.split(","), Path(folder))))
    return True


def sweep_model(model_type: str, dtypes: list[str], out: Path, timeout: int) -> dict[str, Any]:
    """Both arms of one model type, then the comparison of their outputs."""
    folder = out / "work" / model_type
    folder.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"model": model_type, "dtypes": dtypes}
    for arm in ARMS:
        arguments = [model_type, ",".join(dtypes), str(folder)]
        record[arm] = run_subprocess(arm, arguments, folder, timeout)
        if "status" in record[arm]:
            return record
    saved = {arm: torch.load(folder / f"{arm}.pt", weights_only=False) for arm in ARMS}
    for dtype in dtypes:
        record[f"compare {dtype}"] = compare(saved["plain"][dtype], saved["graphmend"][dtype])
    return record


def main() -> None:
    """Sweep the model types given, or run one arm (``--arm``, internal)."""
    if answer_arm_call(run_arm):
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="+", help="model types, each with :dtype,... (float32)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/inductor"))
    parser.add_argument("--timeout", type=int, default=240, help="seconds per arm")
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    for spec in options.types:
        model_type, _, dtypes = spec.partition(":")
        dtype_names = (dtypes or "float32").split(",")
        record = sweep_model(model_type, dtype_names, options.out, options.timeout)
        with open(options.out / "results.jsonl", "a") as journal:
            journal.write(json.dumps(record) + "\n")
        print(json.dumps(record)[:600], flush=True)


if __name__ == "__main__":
    main()
