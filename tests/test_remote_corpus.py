"""The corpus of real ``trust_remote_code`` models in ``bench/remote_corpus/``.

Its files are the published ones (sha256 as in the manifest), and a family
loads offline through transformers and runs eagerly under the hook with the
output it has without it (each arm in its own process, so that the plain
module is one nobody rewrote).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.processes import run_python

BENCH = Path(__file__).resolve().parents[1] / "bench"
#: A family that builds on transformers 4.51 and 5.x (most need 4.x).
FAMILY = "internlm"

ARM = """
import sys
import torch
sys.path.insert(0, {bench!r})
if {arm!r} == "graphmend":
    import graphmend

    graphmend.install()
from measuring import flat_tensors, forward
from remote_corpus import build, inputs_for, load_manifest

model = build({family!r}, load_manifest()[{family!r}])
module = sys.modules[type(model).__module__]
outputs = flat_tensors(forward(model, inputs_for(model)))
torch.save({{"loader": type(module.__loader__).__name__, "outputs": outputs}}, {path!r})
"""


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(BENCH))
    return BENCH


def test_manifest_matches_the_files(bench: Path) -> None:
    from remote_corpus import CORPUS, load_manifest, mismatched_files

    manifest = load_manifest()
    assert len(manifest) >= 15
    for name, family in manifest.items():
        assert mismatched_files(name, family) == [], name
        assert family["licence"] and family["commit"] and family["repository"]
        config = json.loads((CORPUS / name / "config.json").read_text())
        module = config["auto_map"][family["auto_class"]].split(".")[0]
        assert any(entry["file"] == f"{module}.py" for entry in family["files"]), name


def test_mismatched_files_reports_a_changed_file(bench: Path, tmp_path: Path) -> None:
    from remote_corpus import load_manifest, mismatched_files

    family = load_manifest()[FAMILY]
    copy = tmp_path / FAMILY
    copy.mkdir()
    for entry in family["files"]:
        (copy / entry["file"]).write_bytes(
            (BENCH / "remote_corpus" / FAMILY / entry["file"]).read_bytes()
        )
    assert mismatched_files(FAMILY, family, tmp_path) == []
    first = family["files"][0]["file"]
    (copy / first).write_bytes((copy / first).read_bytes() + b"\n")
    assert mismatched_files(FAMILY, family, tmp_path) == [first]


def test_a_family_runs_eagerly_under_the_hook_with_identical_output(
    bench: Path, tmp_path: Path
) -> None:
    import torch

    from measuring import compare

    results = {}
    for arm in ("plain", "graphmend"):
        path = tmp_path / f"{arm}.pt"
        code = ARM.format(bench=str(bench), arm=arm, family=FAMILY, path=str(path))
        env = {"HF_MODULES_CACHE": str(tmp_path / f"modules-{arm}"), "HF_HUB_OFFLINE": "1"}
        completed = run_python("-c", code, env=env, timeout=300)
        assert completed.returncode == 0, completed.stderr[-3000:]
        results[arm] = torch.load(path, weights_only=True)
    assert results["plain"]["loader"] == "SourceFileLoader"
    assert results["graphmend"]["loader"] == "GraphMendLoader"
    comparison = compare(results["plain"]["outputs"], results["graphmend"]["outputs"])
    assert comparison["identical"], comparison
    assert comparison["tensors"] > 0
