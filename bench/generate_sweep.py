"""Generate sweep: ``model.generate`` with a compiled ``forward``, plain vs GraphMend.

Production users compile a model's forward and decode with the KV cache:
``model.forward = torch.compile(model.forward, backend=...)`` then
``model.generate(...)``.  Each decoding step calls the compiled forward with a
longer cache, so cache-length branches, "grow the rotary cache" tests and
warnings logged once are taken several times, with recompiles in between.

Each model type is built like the census does (tiny config, seeded random
weights; ``inductor_sweep.shared_subject``) and run in two processes, plain
then after ``graphmend.install()``.  In each arm, on batch 2 of the census
token ids: greedy ``generate`` (6 new tokens) with a padded attention mask
(left padding for decoders, right for encoder-decoders), then without a mask,
compiled first (one compiled forward for both) and then eagerly.  Per input
set it records the generated ids, the graphs compiled (``CompileCounter``
frame count), the recompiles (Dynamo's "recompiles" log), graph breaks, and
any exception, warning, log record or printed text, and the ``torch.cond``
calls in the graphs (where GraphMend's rewrites ran).  Everything but the
``torch.cond`` calls must be the same in both arms, and the ids and scores
the same as eager.

    python bench/generate_sweep.py TYPE ... [--backend eager] [--cache static]
                                   [--dtype float16] [--out DIR] [--timeout S]

Appends one JSON line per model type to ``DIR/results.jsonl`` (default
``/tmp/generate``) and prints a table row per model type.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from inductor_sweep import ARMS, answer_arm_call, count_nodes, run_subprocess, shared_subject

NEW_TOKENS, PADDING = 6, 3
#: Loggers whose warnings a user sees: transformers', torch's, and the root logger.
WATCHED_LOGGERS = ("transformers", "torch", "")
RECOMPILES_LOGGER = "torch._dynamo.guards.__recompiles"
#: Fields of a run that must be the same in both arms.
COMPARED = ("ids", "scores", "error", "warnings", "printed")
#: Counts that GraphMend may lower but never raise, summed over the input sets (a frame
#: compiled for the first set is reused by the next one).
COUNTED = ("graphs", "recompiles", "breaks")


class Records(logging.Handler):
    """Collects the messages of the log records it sees."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record's message."""
        self.messages.append(f"{record.levelname}: {record.getMessage()}")


@contextlib.contextmanager
def attached(handler: logging.Handler, names: tuple[str, ...]) -> Iterator[None]:
    """``handler`` attached to the loggers ``names`` for the duration."""
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def ready_for_generation(model: Any, cache: str) -> None:
    """The cache implementation, and token ids a tiny config may lack (decoder start, padding)."""
    config = model.generation_config
    if cache != "dynamic":
        config.cache_implementation = cache
    if config.pad_token_id is None:
        eos = config.eos_token_id
        config.pad_token_id = (eos[0] if isinstance(eos, list) else eos) or 0
    if model.config.is_encoder_decoder and config.decoder_start_token_id is None:
        config.decoder_start_token_id = config.bos_token_id or config.pad_token_id


def generation_inputs(model: Any, inputs: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Token ids with a padded mask (left padding for decoders) and without a mask."""
    ids = inputs["input_ids"]
    mask = torch.ones_like(ids)
    if model.config.is_encoder_decoder:
        mask[1, -PADDING:] = 0
    else:
        mask[1, :PADDING] = 0
    return {"padded": {"input_ids": ids, "attention_mask": mask}, "no mask": {"input_ids": ids}}


def fingerprint(tensors: tuple[torch.Tensor, ...]) -> str:
    """A digest of the tensors' bits (any dtype, bfloat16 included): equal digests, equal bits."""
    digest = hashlib.sha256()
    for tensor in tensors:
        raw = tensor.detach().contiguous()
        digest.update(str((raw.dtype, tuple(raw.shape))).encode())
        digest.update(raw.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def observed_generate(model: Any, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Greedy ``generate``: the ids, or the exception, with the warnings, logs and prints."""
    from measuring import describe

    handler = Records(logging.WARNING)
    printed = io.StringIO()
    run: dict[str, Any] = {"ids": None, "scores": None, "error": None}
    with (
        warnings.catch_warnings(record=True) as caught,
        attached(handler, WATCHED_LOGGERS),
        contextlib.redirect_stdout(printed),
    ):
        warnings.simplefilter("always")
        try:
            with torch.no_grad():
                output = model.generate(
                    **inputs,
                    max_new_tokens=NEW_TOKENS,
                    min_new_tokens=NEW_TOKENS,
                    do_sample=False,
                    return_dict_in_generate=True,
                    output_scores=True,
                )
            run["ids"] = output.sequences.tolist()
            run["scores"] = fingerprint(output.scores)
        except Exception as error:
            run["error"] = describe(error)["error"]
    run["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught] + handler.messages
    run["printed"] = printed.getvalue()
    return run


def compiled_runs(model: Any, sets: dict[str, dict], backend: str) -> dict[str, dict]:
    """Each input set through ``generate`` with one compiled forward, with graphs and recompiles.

    The counts are those each set added (the forward stays compiled across sets).
    """
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch._logging.set_logs(recompiles=True)
    counter = CompileCounterWithBackend(backend)
    recompiles = Records(logging.DEBUG)
    original = model.forward
    model.forward = torch.compile(original, backend=counter)
    runs: dict[str, dict] = {}
    try:
        with attached(recompiles, (RECOMPILES_LOGGER,)):
            for label, inputs in sets.items():
                graphs, seen = counter.frame_count, len(recompiles.messages)
                breaks = sum(counters["graph_break"].values())
                run = observed_generate(model, inputs)
                run["graphs"] = counter.frame_count - graphs
                run["recompiles"] = len(recompiles.messages) - seen
                run["recompile reasons"] = recompiles.messages[seen:]
                run["breaks"] = sum(counters["graph_break"].values()) - breaks
                run["conds"] = count_nodes(counter.graphs[graphs:], "cond")
                runs[label] = run
    finally:
        model.forward = original
        torch._logging.set_logs()
    return runs


def run_arm(arm: str, model_type: str, options: list[str], folder: Path) -> dict[str, Any]:
    """One arm in this process: compiled runs first (warnings logged once), then eager ones.

    ``options``: the backend, the cache implementation and the dtype.
    """
    backend, cache, dtype = options
    subject = shared_subject(arm, model_type, folder)
    subject.model.to(getattr(torch, dtype))
    ready_for_generation(subject.model, cache)
    sets = generation_inputs(subject.model, subject.inputs)
    compiled = compiled_runs(subject.model, sets, backend)
    eager = {label: observed_generate(subject.model, inputs) for label, inputs in sets.items()}
    return {"class": subject.choice["class"], "compiled": compiled, "eager": eager}


def differences(plain: dict[str, Any], mended: dict[str, Any]) -> list[str]:
    """What differs between the arms (fewer graphs is no defect), and compiled runs unlike eager."""
    found = []
    for label, run in plain["compiled"].items():
        other = mended["compiled"].get(label, {})
        found += [f"{label}: {field}" for field in COMPARED if run.get(field) != other.get(field)]
        for name, arm in (("plain", plain), ("graphmend", mended)):
            for field in ("ids", "scores"):
                if arm["compiled"][label][field] != arm["eager"][label][field]:
                    found.append(f"{label}: {name} compiled {field} != eager")
        if plain["eager"][label] != mended["eager"][label]:
            found.append(f"{label}: eager")
    for field in COUNTED:
        counts = [sum(run[field] for run in arm["compiled"].values()) for arm in (plain, mended)]
        if counts[1] != counts[0]:
            found.append(f"{'MORE' if counts[1] > counts[0] else 'fewer'} {field}")
    return found


def sweep_model(model_type: str, options: list[str], out: Path, timeout: int) -> dict[str, Any]:
    """Both arms of one model type, then what differs between them.

    ``options``: the backend, the cache implementation and the dtype.
    """
    folder = out / "work" / "-".join(options) / model_type
    folder.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"model": model_type, "options": options}
    for arm in ARMS:
        arguments = [model_type, ",".join(options), str(folder)]
        record[arm] = run_subprocess(arm, arguments, folder, timeout, script=__file__)
        if "status" in record[arm]:
            return record
    record["differences"] = differences(record["plain"], record["graphmend"])
    return record


def table_row(record: dict[str, Any]) -> str:
    """A Markdown row: type, ids equal, graphs and recompiles plain/GraphMend, differences."""
    failed = next((arm for arm in ARMS if "status" in record.get(arm, {"status": "not run"})), None)
    if failed:
        return f"| {record['model']} | {failed} arm: {record[failed]['status']} | | | |"
    plain, mended = record["plain"], record["graphmend"]

    def total(arm: dict[str, Any], field: str) -> int:
        return sum(run[field] for run in arm["compiled"].values())

    same = not any(text.endswith(" ids") or "ids !=" in text for text in record["differences"])
    counts = [f"{total(plain, field)}/{total(mended, field)}" for field in ("graphs", "recompiles")]
    errors = {run["error"] for run in plain["compiled"].values() if run["error"]}
    notes = "; ".join(record["differences"] + [f"both: {e}" for e in sorted(errors)])
    return f"| {record['model']} | {'yes' if same else 'NO'} | {' | '.join(counts)} | {notes} |"


def main() -> None:
    """Sweep the model types given, or run one arm (``--arm``, internal)."""
    if answer_arm_call(run_arm):
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="+", help="model types")
    parser.add_argument("--backend", default="eager", help="torch.compile backend (eager)")
    parser.add_argument("--cache", default="dynamic", help="cache implementation (dynamic)")
    parser.add_argument("--dtype", default="float32", help="the model's dtype (float32)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/generate"))
    parser.add_argument("--timeout", type=int, default=300, help="seconds per arm")
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    print("| type | ids equal | graphs plain/GraphMend | recompiles plain/GraphMend | notes |")
    print("| --- | --- | --- | --- | --- |", flush=True)
    for model_type in options.types:
        settings = [options.backend, options.cache, options.dtype]
        record = sweep_model(model_type, settings, options.out, options.timeout)
        with open(options.out / "results.jsonl", "a") as journal:
            journal.write(json.dumps(record) + "\n")
        print(table_row(record), flush=True)


if __name__ == "__main__":
    main()
