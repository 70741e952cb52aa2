"""Graph breaks of real ``trust_remote_code`` models, with and without GraphMend.

Each family in ``bench/remote_corpus/manifest.json`` (published model files,
byte for byte, fetched by ``remote_corpus_fetch.py``, and a tiny ``config.json`` of
ours) is loaded offline through
transformers (``AutoConfig.from_pretrained(folder, trust_remote_code=True)``,
then ``from_config``) and measured by ``measuring.measure``: eagerly, under
``torch._dynamo.explain`` (breaks with reasons, category and innermost
``file:line``) and under ``torch.compile(fullgraph=True)``, outputs compared
bitwise.  Each arm (plain, then GraphMend) runs in its own process with its
own dynamic-module cache; the first saves the weights and inputs, the second
loads them with ``strict=True`` and compares its eager outputs with the
first's.

    python bench/remote_corpus.py [--only REGEX] [--dtype float32] [--backend eager]
                                  [--timeout S] [--out DIR] [--corpus DIR]

``--corpus`` measures another folder laid out as ``bench/remote_corpus/`` (a
``manifest.json`` and one folder per family, its files in place).

Writes ``remote-corpus.json`` and ``remote-corpus.md`` to ``--out`` (default
``bench/results/remote-corpus-<transformers version>/``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parent / "remote_corpus"
ARMS = ("plain", "graphmend")
DTYPES = ("float32", "float16", "bfloat16")


def load_manifest(corpus: Path = CORPUS) -> dict[str, dict[str, Any]]:
    """The families of the corpus, by name."""
    return json.loads((corpus / "manifest.json").read_text())["families"]


def mismatched_files(name: str, family: dict[str, Any], corpus: Path = CORPUS) -> list[str]:
    """Files of a family that are missing or whose sha256 differs from the manifest's."""
    wrong = []
    for entry in family["files"]:
        path = corpus / name / entry["file"]
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            wrong.append(entry["file"])
    return wrong


def build(name: str, family: dict[str, Any], corpus: Path = CORPUS) -> Any:
    """The family's model from its tiny config, seeded random weights, fp32, eval mode.

    Some published code makes parameters with ``torch.empty`` that its own weight
    initialisation never fills (ChatGLM2/3, DeepSeek-V3's ``e_score_correction_bias``):
    left alone they hold whatever memory held, so outputs were NaN in some families and
    expert routing changed from run to run.  They are made NaN while the model is built
    and then drawn from a seeded normal distribution.
    """
    import torch
    import transformers

    folder = str(corpus / name)
    _stage_modules(name, family, corpus)
    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    auto_class = getattr(transformers, family["auto_class"])
    torch.manual_seed(0)
    fill, deterministic = (
        torch.utils.deterministic.fill_uninitialized_memory,
        (torch.are_deterministic_algorithms_enabled()),
    )
    torch.utils.deterministic.fill_uninitialized_memory = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        model = auto_class.from_config(config, trust_remote_code=True).float().eval()
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    _initialise_unset(model)
    return model


def unfetched(
    names: list[str], manifest: dict[str, dict[str, Any]], corpus: Path = CORPUS
) -> str | None:
    """What is missing of these families' published files, and how to fetch it; else ``None``."""
    wrong = {name: mismatched_files(name, manifest[name], corpus) for name in names}
    missing = "; ".join(f"{name}: {', '.join(files)}" for name, files in wrong.items() if files)
    if not missing:
        return None
    return (
        f"published files missing or not as in the manifest ({missing}): "
        "python bench/remote_corpus_fetch.py fetches them"
    )


def _stage_modules(name: str, family: dict[str, Any], corpus: Path) -> None:
    """Put every published file of the family in the dynamic-module cache beforehand.

    From a local folder transformers copies only the files the model file imports
    itself; from the Hub it fetches imports of imports too (MOSS's quantization code
    imports ``custom_autotune``).  Staging all of them loads the folder as the Hub would.
    """
    from transformers.utils import HF_MODULES_CACHE

    staged = Path(HF_MODULES_CACHE) / "transformers_modules" / name
    staged.mkdir(parents=True, exist_ok=True)
    for entry in family["files"]:
        target = staged / entry["file"]
        if not target.exists():
            target.write_bytes((corpus / name / entry["file"]).read_bytes())


def _initialise_unset(model: Any) -> None:
    """Draw each parameter holding a NaN from a seeded normal(0, 0.02)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point() and parameter.isnan().any():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)


def inputs_for(model: Any) -> dict[str, Any]:
    """Token ids and, where ``forward`` takes one, an attention mask with padding in the
    second row (census.py's inputs)."""
    import inspect

    import torch

    from census import make_input

    generator = torch.Generator().manual_seed(0)
    names = ["input_ids"]
    if "attention_mask" in inspect.signature(model.forward).parameters:
        names.append("attention_mask")
    return {name: make_input(name, model.config, generator) for name in names}


def run_arm(job: dict[str, Any]) -> dict[str, Any]:
    """One arm of one family, in this process; the result is JSON-ready."""
    import torch

    from measuring import compare, describe, measure, timed

    if job["arm"] == "graphmend":
        import graphmend

        graphmend.install()
    torch.set_num_threads(1)
    name, folder, corpus = job["family"], Path(job["folder"]), Path(job["corpus"])
    family = load_manifest(corpus)[name]
    result: dict[str, Any] = {"arm": job["arm"], "status": "ok"}
    with timed(result, "build"):
        try:
            model = build(name, family, corpus)
            state = folder / "state.pt"
            if job["arm"] == ARMS[0]:
                inputs = inputs_for(model)
                torch.save({"state_dict": model.state_dict(), "inputs": inputs}, state)
            saved = torch.load(state, weights_only=True)
            model.load_state_dict(saved["state_dict"], strict=True)
            inputs = saved["inputs"]
        except Exception as error:
            return {**result, "status": "not_built", **describe(error)}
    result["module"] = type(model).__module__
    result["loader"] = type(sys.modules[type(model).__module__].__loader__).__name__
    result["parameters"] = sum(p.numel() for p in model.parameters())
    reference_path = folder / "outputs.pt"
    first = job["arm"] == ARMS[0]
    reference = {} if first else torch.load(reference_path, weights_only=True)
    runs, outputs, sites = {}, {}, {}
    for dtype in job["dtypes"]:
        runs[dtype], outputs[dtype] = measure(model, inputs, dtype, job["backend"], sites)
        if reference.get(dtype, {}).get("eager") and "eager" in outputs[dtype]:
            runs[dtype]["eager_same_as_first_arm"] = compare(
                reference[dtype]["eager"], outputs[dtype]["eager"]
            )
    if first:
        torch.save(outputs, reference_path)
    result["runs"] = runs
    return result


def arm_env(modules_cache: Path) -> dict[str, str]:
    """Offline, one thread, a dynamic-module cache of the arm's own, GraphMend's cache too."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_MODULES_CACHE": str(modules_cache),
        "GRAPHMEND_CACHE_DIR": str(modules_cache / "graphmend"),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    env.pop("GRAPHMEND", None)
    return env


def measure_family(name: str, options: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Both arms of one family, each in a fresh process; the second only if the first built."""
    started = time.perf_counter()
    folder = scratch / name
    folder.mkdir()
    result: dict[str, Any] = {"family": name, "arms": {}}
    for arm in ARMS:
        job = {"arm": arm, "family": name, "folder": str(folder), "dtypes": options.dtypes}
        job.update(backend=options.backend, corpus=str(options.corpus))
        command = [sys.executable, __file__, "--arm-job", json.dumps(job)]
        log = folder / f"{arm}.log"
        try:
            with log.open("w") as output:
                subprocess.run(
                    command,
                    env=arm_env(folder / f"modules-{arm}"),
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    timeout=options.timeout,
                    check=True,
                )
            outcome = json.loads((folder / f"{arm}.json").read_text())
        except subprocess.TimeoutExpired:
            outcome = {"arm": arm, "status": "timeout"}
        except (subprocess.CalledProcessError, FileNotFoundError):
            outcome = {"arm": arm, "status": "crashed", "log_tail": log.read_text()[-2000:]}
        result["arms"][arm] = outcome
        if outcome["status"] != "ok":
            break
    result["status"] = result["arms"][ARMS[0]]["status"]
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def progress_line(result: dict[str, Any], dtypes: list[str]) -> str:
    """A one-line summary: breaks plain -> GraphMend, ``!`` where fullgraph fails."""
    if result["status"] != "ok":
        first = result["arms"][ARMS[0]]
        return f"{result['status']}: {first.get('error', '')[:120]} {first.get('location') or ''}"
    parts = []
    for dtype in dtypes:
        first = result["arms"][ARMS[0]]["runs"].get(dtype, {})
        if "eager_error" in first:
            parts.append(f"{dtype} eager error: {first['eager_error']['error'][:100]}")
            continue
        cells = []
        for arm in ARMS:
            run = result["arms"].get(arm, {}).get("runs", {}).get(dtype, {})
            failed = "" if run.get("fullgraph", {}).get("ok") else "!"
            cells.append(f"{run.get('breaks', '?')}{failed}")
        parts.append(f"{dtype} {'->'.join(cells)}")
    return "breaks " + ", ".join(parts)


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--dtype`` becomes the list ``dtypes``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", metavar="REGEX", help="families to run (re.search)")
    parser.add_argument("--dtype", default="float32", help=f"comma-separated, from {DTYPES}")
    parser.add_argument("--backend", default="eager", help="fullgraph=True backend (eager)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per arm (300)")
    parser.add_argument("--out", type=Path, help="output directory")
    parser.add_argument(
        "--corpus", type=Path, default=CORPUS, help="corpus folder (bench/remote_corpus)"
    )
    parser.add_argument("--arm-job", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    options.dtypes = [name.strip() for name in options.dtype.split(",") if name.strip()]
    unknown = sorted(set(options.dtypes) - set(DTYPES))
    if unknown or not options.dtypes:
        parser.error(f"--dtype: unknown {', '.join(unknown) or '(empty)'}; use {', '.join(DTYPES)}")
    return options


def metadata(options: argparse.Namespace, families: list[str]) -> dict[str, Any]:
    """Versions and settings that the results depend on."""
    import graphmend
    from graphmend.config import Config
    from machine import environment

    return {
        **environment(),
        "graphmend": graphmend.__version__,
        "rewrites": sorted(Config.from_env().rewrites),
        "dtypes": options.dtypes,
        "explain_backend": "eager",
        "fullgraph_backend": options.backend,
        "timeout_seconds": options.timeout,
        "only": options.only,
        "corpus": str(options.corpus),
        "families": len(families),
    }


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    if options.arm_job:
        job = json.loads(options.arm_job)
        result = run_arm(job)
        (Path(job["folder"]) / f"{job['arm']}.json").write_text(json.dumps(result))
        return 0
    from remote_corpus_report import write_report

    manifest = load_manifest(options.corpus)
    names = [name for name in manifest if options.only is None or re.search(options.only, name)]
    if not names:
        print(f"no family matches {options.only!r}", file=sys.stderr)
        return 2
    problem = unfetched(names, manifest, options.corpus)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    version = importlib.metadata.version("transformers")
    out = options.out or Path(__file__).parent / "results" / f"remote-corpus-{version}"
    meta = metadata(options, names)
    print(f"transformers {version}: {len(names)} families; breaks without->with GraphMend")
    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="graphmend-corpus-") as scratch:
        for index, name in enumerate(names, 1):
            result = measure_family(name, options, Path(scratch))
            results.append(result)
            line = progress_line(result, options.dtypes)
            print(f"[{index:>2}/{len(names)}] {name}: {line} ({result['seconds']} s)", flush=True)
    meta["wall_seconds"] = round(time.perf_counter() - started, 1)
    report = {"meta": meta, "families": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "remote-corpus.json").write_text(json.dumps(report, indent=1) + "\n")
    written = [out / "remote-corpus.json", *write_report(report, manifest, out)]
    print(f"wrote {', '.join(map(str, written))} ({meta['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
