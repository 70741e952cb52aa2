"""Training sweep: plain vs GraphMend in the ways users run models beyond eval-mode forward.

The census measures eval-mode forward and ``generate_sweep.py`` greedy decoding;
this covers the rest of the common uses.  Each model type is built like the
census does (tiny config, seeded random weights; ``inductor_sweep.shared_subject``)
and run in two processes, plain then after ``graphmend.install()``, with the
same weights and inputs.  In each arm:

* training: ``model.train()`` (dropout on, ``torch.manual_seed(0)`` before each
  call), labels passed where the head takes them (the loss computed inside),
  ``loss.backward()``; eagerly and under ``torch.compile`` with backends
  "eager" and "aot_eager".  The loss, outputs and every parameter's ``.grad``;
* train checkpointing: the same with ``gradient_checkpointing_enable()``;
* train autocast float16: the same under ``torch.autocast("cpu", float16)``;
* train layerdrop: the same with every module's ``layerdrop`` at 0.5, where
  there is one (BART-style encoders and decoders skip layers at random);
* dynamic: ``torch.compile(dynamic=True)`` in eval mode, called on the census
  inputs, then on inputs 4 tokens shorter and with an all-ones attention mask;
* autocast: ``torch.autocast("cpu", bfloat16 / float16)``, eager and compiled;
* the model in another dtype (``--dtype``): everything above with its weights and
  floating-point inputs in that dtype (float16 takes the overflow-clamping branches);
* inference_mode: under ``torch.inference_mode()`` (inference tensors), eager and compiled;
* flags: ``output_attentions``, ``output_hidden_states`` and ``return_dict=False``,
  eager and compiled.

Every tensor is fingerprinted (its bits).  Per run, the fingerprints, errors,
warnings, log records and printed text must be the same in both arms, and
GraphMend's graphs (``CompileCounter`` frames) and graph breaks never more
than plain's.

    python bench/training_sweep.py TYPE ... [--dtype float16] [--out DIR] [--timeout S]

Appends one JSON line per model type to ``DIR/results.jsonl`` (default
``/tmp/training``) and prints one line per model type.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from generate_sweep import WATCHED_LOGGERS, Records, attached, fingerprint
from inductor_sweep import ARMS, answer_arm_call, input_sets, run_subprocess, shared_subject

COMPILED_BACKENDS = ("eager", "aot_eager")
#: The layer-drop probability of the "train layerdrop" runs (models with ``layerdrop``).
LAYERDROP = 0.5
#: Heads whose ``forward`` takes token labels (the ids themselves) or one class per row.
TOKEN_LABEL_HEADS = ("seq2seq-lm", "causal-lm", "masked-lm")
CLASS_LABEL_HEADS = ("sequence-classification", "image-classification")
FLAGS = (
    {"output_attentions": True},
    {"output_hidden_states": True},
    {"return_dict": False},
)
#: Fields of a run that must be the same in both arms; counts GraphMend must not raise.
COMPARED = ("outputs", "grads", "error", "warnings", "printed")
COUNTED = ("graphs", "breaks")


def fingerprints(value: Any) -> list[str]:
    """Path and bit fingerprint of every tensor in a model output."""
    from measuring import flat_tensors

    return [f"{path}={fingerprint((tensor,))}" for path, tensor in flat_tensors(value)]


def with_labels(head: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs with labels the head takes (target ids, or class 0 per row), if any."""
    if head in TOKEN_LABEL_HEADS:
        target = inputs.get("decoder_input_ids", inputs.get("input_ids"))
        return {**inputs, "labels": target} if target is not None else inputs
    if head in CLASS_LABEL_HEADS:
        rows = next(iter(inputs.values())).shape[0]
        return {**inputs, "labels": torch.zeros(rows, dtype=torch.long)}
    return inputs


def loss_of(output: Any) -> torch.Tensor:
    """The model's own loss, or the mean of its first output."""
    loss = getattr(output, "loss", None)
    return loss if loss is not None else output[0].float().mean()


def training_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One seeded training call and backward: output and gradient fingerprints."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    output = model(**inputs)
    loss = loss_of(output)
    loss.backward()
    grads = [
        f"{name}={fingerprint((parameter.grad,))}"
        for name, parameter in model.named_parameters()
        if parameter.grad is not None
    ]
    return {
        "outputs": [f"loss={fingerprint((loss.detach(),))}", *fingerprints(output)],
        "grads": grads,
    }


def inference_step(model: Callable[..., Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """One seeded gradient-free call: output fingerprints."""
    torch.manual_seed(0)
    with torch.no_grad():
        return {"outputs": fingerprints(model(**inputs))}


def observed(step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``step``'s record, or the exception it raised, with the warnings, logs and prints."""
    from measuring import describe

    handler = Records(logging.WARNING)
    printed = io.StringIO()
    with (
        warnings.catch_warnings(record=True) as caught,
        attached(handler, WATCHED_LOGGERS),
        contextlib.redirect_stdout(printed),
    ):
        warnings.simplefilter("always")
        try:
            record = {"error": None, **step()}
        except Exception as error:
            record = {"error": describe(error)["error"], "outputs": None}
    record["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught] + handler.messages
    record["printed"] = printed.getvalue()
    return record


def counted(
    call: Callable[[Callable[..., Any]], list[dict[str, Any]]],
    model: torch.nn.Module,
    backend: str,
    **options: Any,
) -> list[dict[str, Any]]:
    """The steps ``call`` makes of ``torch.compile(model)``, run, with the graphs and breaks
    each added."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter, **options)
    runs = []
    for step in call(compiled):
        graphs, breaks = counter.frame_count, sum(counters["graph_break"].values())
        run = observed(step)
        run["graphs"] = counter.frame_count - graphs
        run["breaks"] = sum(counters["graph_break"].values()) - breaks
        runs.append(run)
    return runs


def training_runs(model: torch.nn.Module, inputs: dict[str, torch.Tensor], label: str) -> dict:
    """Training steps: eager, then compiled with each backend."""
    model.train()
    runs = {f"{label} uncompiled": observed(lambda: training_step(model, inputs))}
    for backend in COMPILED_BACKENDS:
        (runs[f"{label} {backend}"],) = counted(
            lambda compiled: [lambda: training_step(compiled, inputs)], model, backend
        )
    model.eval()
    return runs


def checkpointing_runs(model: Any, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Training steps with gradient checkpointing on, if the model supports it."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        return {}
    model.gradient_checkpointing_enable()
    try:
        return training_runs(model, inputs, "train checkpointing")
    finally:
        model.gradient_checkpointing_disable()


def layerdrop_runs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Training steps with every ``layerdrop`` attribute set to ``LAYERDROP``, if there are any."""
    modules = [m for m in model.modules() if isinstance(getattr(m, "layerdrop", None), float)]
    if not modules:
        return {}
    saved = [module.layerdrop for module in modules]
    for module in modules:
        module.layerdrop = LAYERDROP
    try:
        return training_runs(model, inputs, "train layerdrop")
    finally:
        for module, value in zip(modules, saved, strict=True):
            module.layerdrop = value


def dynamic_runs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``dynamic=True`` compiles on the census inputs, then on shorter ones and on an all-ones
    attention mask (eval mode)."""
    sets = input_sets(inputs)
    runs = counted(
        lambda compiled: [
            lambda values=values: inference_step(compiled, values) for values in sets.values()
        ],
        model,
        "eager",
        dynamic=True,
    )
    return {f"dynamic {label}": run for label, run in zip(sets, runs, strict=True)}


def variant_runs(
    model: torch.nn.Module, label: str, inputs: dict[str, Any], context: Callable
) -> dict:
    """One inference variant, eager and compiled (backend "eager"), under ``context()``."""

    def step(target: Callable[..., Any]) -> dict[str, Any]:
        with context():
            return inference_step(target, inputs)

    (compiled,) = counted(lambda target: [lambda: step(target)], model, "eager")
    return {f"{label} eager": observed(lambda: step(model)), f"{label} compiled": compiled}


def run_arm(arm: str, model_type: str, options: list[str], folder: Path) -> dict[str, Any]:
    """One arm in this process: every variant on the shared subject."""
    from measuring import cast

    (dtype_name,) = options
    dtype = getattr(torch, dtype_name)
    subject = shared_subject(arm, model_type, folder)
    model, inputs = subject.model.to(dtype), cast(subject.inputs, dtype)
    # The plain arm ran the model when it chose it: run it here too, so that warnings
    # logged once are spent in both arms before anything is observed.
    inference_step(model, inputs)
    labelled = with_labels(subject.choice["head"], inputs)
    runs = {**training_runs(model, labelled, "train"), **layerdrop_runs(model, labelled)}
    runs.update(checkpointing_runs(model, labelled))
    with torch.autocast("cpu", dtype=torch.float16):
        runs.update(training_runs(model, labelled, "train autocast float16"))
    runs.update(dynamic_runs(model, inputs))
    for low in (torch.bfloat16, torch.float16):
        autocast = lambda low=low: torch.autocast("cpu", dtype=low)  # noqa: E731
        runs.update(variant_runs(model, f"autocast {low}", inputs, autocast))
    runs.update(variant_runs(model, "inference_mode", inputs, torch.inference_mode))
    for flag in FLAGS:
        label = ",".join(f"{name}={value}" for name, value in flag.items())
        runs.update(variant_runs(model, label, {**inputs, **flag}, contextlib.nullcontext))
    return {"class": subject.choice["class"], "runs": runs}


def differences(plain: dict[str, Any], mended: dict[str, Any]) -> list[str]:
    """What differs between the arms per run (fewer graphs or breaks is no defect)."""
    found = []
    for label, run in plain["runs"].items():
        other = mended["runs"].get(label, {})
        for field in COMPARED:
            if run.get(field) != other.get(field):
                found.append(
                    f"{label}: {field} {first_difference(run.get(field), other.get(field))}"
                )
        for field in COUNTED:
            if other.get(field, 0) > run.get(field, 0):
                found.append(f"{label}: MORE {field} {run[field]} -> {other[field]}")
    return found


def first_difference(plain: Any, mended: Any) -> str:
    """The first differing entry of two fingerprint lists, or both values."""
    if isinstance(plain, list) and isinstance(mended, list) and len(plain) == len(mended):
        for want, got in zip(plain, mended, strict=True):
            if want != got:
                return f"first at {want.split('=')[0]}"
    return f"{str(plain)[:200]!r} vs {str(mended)[:200]!r}"


def sweep_model(model_type: str, dtype: str, out: Path, timeout: int) -> dict[str, Any]:
    """Both arms of one model type in the model dtype ``dtype``, then what differs between them."""
    folder = out / "work" / dtype / model_type
    folder.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"model": model_type, "dtype": dtype}
    for arm in ARMS:
        arguments = [model_type, dtype, str(folder)]
        record[arm] = run_subprocess(arm, arguments, folder, timeout, __file__)
        if "status" in record[arm]:
            return record
    record["differences"] = differences(record["plain"], record["graphmend"])
    return record


def summary(record: dict[str, Any]) -> str:
    """One line: the model type, then its differences, or an arm's failure."""
    failed = next((arm for arm in ARMS if "status" in record.get(arm, {"status": "not run"})), None)
    if failed:
        tail = record[failed].get("tail", "")[-300:]
        return f"{record['model']}: {failed} arm {record[failed]['status']}: {tail}"
    plain = record["plain"]["runs"]
    errors = sorted({run["error"][:80] for run in plain.values() if run["error"]})
    notes = record["differences"] or ["same"]
    return f"{record['model']}: {'; '.join(notes)}" + (f" (both: {errors})" if errors else "")


def main() -> None:
    """Sweep the model types given, or run one arm (``--arm``, internal)."""
    if answer_arm_call(run_arm):
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="+", help="model types")
    parser.add_argument("--dtype", default="float32", help="the model's dtype (float32)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/training"))
    parser.add_argument("--timeout", type=int, default=600, help="seconds per arm")
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    for model_type in options.types:
        record = sweep_model(model_type, options.dtype, options.out, options.timeout)
        with open(options.out / "results.jsonl", "a") as journal:
            journal.write(json.dumps(record) + "\n")
        print(summary(record), flush=True)


if __name__ == "__main__":
    main()
