"""GraphMend demo: a trust_remote_code model that cannot compile as one graph, before and after.

Loads ``examples/tiny_remote_model`` through transformers with
``trust_remote_code=True`` (offline, random weights, the same seed in both
runs), counts graphs and graph breaks with ``torch._dynamo.explain``, tries
``torch.compile(fullgraph=True)`` with TorchInductor, and compares the
compiled output with eager bit for bit.  Each arm runs in its own process.

    python examples/demo.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "tiny_remote_model"


def run_arm(arm: str, result_path: Path) -> None:
    import torch

    if arm == "graphmend":
        import graphmend

        graphmend.install()
    from torch._dynamo.utils import counters
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(MODEL_DIR, trust_remote_code=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=True).eval()
    input_ids = torch.randint(
        0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1)
    )
    result: dict[str, object] = {"module": type(model).__module__}
    with torch.no_grad():
        eager = model(input_ids).logits
        counters.clear()
        explained = torch._dynamo.explain(model)(input_ids)
        result["graphs"] = explained.graph_count
        # explain() and Dynamo's counters each miss some breaks; take the larger.
        result["breaks"] = max(explained.graph_break_count, sum(counters["graph_break"].values()))
        result["reasons"] = sorted(
            {
                (_where(r.user_stack[-1]), r.reason.splitlines()[0][:60])
                for r in explained.break_reasons
                if r.user_stack
            }
        )
        result["fullgraph"], result["identical"], result["inductor"] = "fails", None, "fails"
        try:
            torch._dynamo.reset()
            compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(input_ids).logits
            result["fullgraph"] = "compiles"
            result["identical"] = bool(torch.equal(compiled, eager))
            torch._dynamo.reset()
            inductor_model = torch.compile(model, fullgraph=True)
            inductor = inductor_model(input_ids).logits
            result["inductor"] = f"compiles, max|diff| {(inductor - eager).abs().max().item():.0e}"
            result["invalid"] = _failure(inductor_model, input_ids + config.vocab_size)
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            result["error"] = str(error).splitlines()[0][:100]
        result["invalid_eager"] = _failure(model, input_ids + config.vocab_size)
    torch.save(eager, result_path.with_suffix(".pt"))
    result_path.write_text(json.dumps(result))


def _where(frame) -> str:
    """``file:line  source`` of a frame of the model's code."""
    lines = Path(frame.filename).read_text().splitlines()
    text = lines[frame.lineno - 1].strip() if 0 < frame.lineno <= len(lines) else ""
    return f"{Path(frame.filename).name}:{frame.lineno}  {text[:60]}"


def _failure(model, input_ids) -> str:
    """What calling ``model`` on out-of-range token ids raises."""
    try:
        model(input_ids)
    except Exception as error:  # noqa: BLE001 - the demo shows it
        return f"{type(error).__name__}: {error}"
    return "no error"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=["plain", "graphmend"], help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.arm:
        run_arm(options.arm, options.result)
        return 0

    print("GraphMend demo: TinyLM, a trust_remote_code model bundled in examples/tiny_remote_model")
    print("(random weights, seed 0; torch._dynamo.explain, then torch.compile(fullgraph=True))\n")
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_MODULES_CACHE": str(Path(scratch) / "hf_modules"),
            "TORCHINDUCTOR_CACHE_DIR": str(Path(scratch) / "inductor"),
        }
        env.pop("GRAPHMEND", None)
        for arm in ("plain", "graphmend"):
            result_path = Path(scratch) / f"{arm}.json"
            arm_env = {**env, "GRAPHMEND_LOG": "debug"} if arm == "graphmend" else env
            print(f"running {'without' if arm == 'plain' else 'with'} GraphMend ...", flush=True)
            child = subprocess.run(
                [sys.executable, __file__, "--arm", arm, "--result", str(result_path)],
                env=arm_env,
                capture_output=True,
                text=True,
            )
            if child.returncode != 0:
                print(child.stdout + child.stderr)
                return child.returncode
            results[arm] = json.loads(result_path.read_text())
            results[arm]["stdout"] = child.stdout
            results[arm]["log"] = [
                line
                for line in child.stderr.splitlines()
                if line.startswith("graphmend: transformers_modules") and "rewritten (" in line
            ]
        import torch

        same_eager = torch.equal(
            torch.load(Path(scratch) / "plain.pt"), torch.load(Path(scratch) / "graphmend.pt")
        )

    plain, mended = results["plain"], results["graphmend"]
    rows = [
        ("graphs (torch._dynamo.explain)", plain["graphs"], mended["graphs"]),
        ("graph breaks", plain["breaks"], mended["breaks"]),
        ("fullgraph=True, aot_eager backend", plain["fullgraph"], mended["fullgraph"]),
        ("  output == eager, bitwise", _yes_no(plain["identical"]), _yes_no(mended["identical"])),
        ("fullgraph=True, inductor", plain["inductor"], mended["inductor"]),
    ]
    print(f"\n{'':36}{'without GraphMend':<30}with GraphMend")
    for label, before, after in rows:
        print(f"{label:36}{str(before):<30}{after}")
    for arm in ("plain", "graphmend"):
        if "error" in results[arm]:
            print(
                f"\nfullgraph error {'without' if arm == 'plain' else 'with'} GraphMend: "
                f"{results[arm]['error']}"
            )
    print(f"\neager outputs of the two runs are bit-identical: {_yes_no(same_eager)}")
    print(f"\nout-of-range input_ids, eager: {mended['invalid_eager']}")
    print(f"out-of-range input_ids, compiled with GraphMend (inductor): {mended.get('invalid')}")
    print("\nwhere the graph breaks without GraphMend (torch._dynamo.explain):")
    for where, reason in plain["reasons"]:
        print(f"  {where}\n      {reason}")
    print("\nwhat GraphMend did (GRAPHMEND_LOG=debug):")
    for line in mended["log"]:
        print("  " + line)
    print("\nthe model's own prints still appear, after each compiled graph:")
    print(textwrap.indent("\n".join(mended["stdout"].splitlines()[-4:]), "  "))
    same_failure = mended.get("invalid") == mended["invalid_eager"]
    return 0 if mended["breaks"] == 0 and mended["identical"] and same_failure else 1


def _yes_no(value: object) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


if __name__ == "__main__":
    sys.exit(main())
