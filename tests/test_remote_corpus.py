"""The corpus of real ``trust_remote_code`` models in ``bench/remote_corpus/``.

The published model code is not in this repository: the manifest says where
each file is published (repository, commit, sha256), ``remote_corpus_fetch.py``
fetches and checks it, and each family's folder holds only a tiny config of
ours.  The runner is tested on a family of our own (``examples/tiny_remote_model``)
set up as a corpus: it loads offline through transformers and runs eagerly
under the hook with the output it has without it (each arm in its own process,
so that the plain module is one nobody rewrote).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers.processes import run_python

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
EXAMPLE = ROOT / "examples" / "tiny_remote_model"
FAMILY = "tinylm"

ARM = """
import sys
from pathlib import Path
import torch
sys.path.insert(0, {bench!r})
if {arm!r} == "graphmend":
    import graphmend

    graphmend.install()
from measuring import flat_tensors, forward
from remote_corpus import build, inputs_for, load_manifest

corpus = Path({corpus!r})
model = build({family!r}, load_manifest(corpus)[{family!r}], corpus)
module = sys.modules[type(model).__module__]
outputs = flat_tensors(forward(model, inputs_for(model)))
torch.save({{"loader": type(module.__loader__).__name__, "outputs": outputs}}, {path!r})
"""


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(BENCH))
    return BENCH


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def own_corpus(root: Path) -> tuple[Path, dict[str, Any]]:
    """A corpus under ``root`` whose one family is our example model."""
    corpus = root / "corpus"
    shutil.copytree(EXAMPLE, corpus / FAMILY)
    files = [
        {"file": path.name, "path": f"model/{path.name}", "sha256": _sha256(path.read_bytes())}
        for path in sorted((corpus / FAMILY).glob("*.py"))
    ]
    family = {
        "description": "TinyLM (ours)",
        "repository": "https://github.com/graphmend/tinylm",
        "commit": "0" * 40,
        "licence": "the project's",
        "auto_class": "AutoModelForCausalLM",
        "files": files,
    }
    manifest = {"about": "test corpus", "families": {FAMILY: family}}
    (corpus / "manifest.json").write_text(json.dumps(manifest))
    return corpus, family


def test_manifest_names_every_published_file(bench: Path) -> None:
    from remote_corpus import CORPUS, load_manifest

    manifest = load_manifest()
    assert len(manifest) >= 15
    for name, family in manifest.items():
        assert family["licence"], name
        assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", family["repository"]), name
        assert re.fullmatch(r"[0-9a-f]{40}", family["commit"]), name
        for entry in family["files"]:
            assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]), (name, entry)
            assert entry["path"].endswith(entry["file"]), (name, entry)
        config = json.loads((CORPUS / name / "config.json").read_text())
        module = config["auto_map"][family["auto_class"]].split(".")[0]
        assert any(entry["file"] == f"{module}.py" for entry in family["files"]), name


def test_published_code_is_never_committed() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "bench/remote_corpus"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    names = {Path(line).name for line in listed.stdout.splitlines()}
    assert names == {"manifest.json", "config.json"}
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "bench/remote_corpus/chatglm3/modeling_chatglm.py"],
        cwd=ROOT,
    )
    assert ignored.returncode == 0


def test_mismatched_files_reports_a_changed_file(bench: Path, tmp_path: Path) -> None:
    from remote_corpus import mismatched_files

    corpus, family = own_corpus(tmp_path)
    assert mismatched_files(FAMILY, family, corpus) == []
    first = family["files"][0]["file"]
    (corpus / FAMILY / first).write_bytes((corpus / FAMILY / first).read_bytes() + b"\n")
    assert mismatched_files(FAMILY, family, corpus) == [first]


def _published(tmp_path: Path, family: dict[str, Any]) -> str:
    """The family's files laid out as a file:// mirror; the source template for it."""
    for entry in family["files"]:
        target = tmp_path / "mirror" / "graphmend/tinylm" / family["commit"] / entry["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((EXAMPLE / entry["file"]).read_bytes())
    return (tmp_path / "mirror").as_uri() + "/{repository}/{commit}/{path}"


def test_fetch_puts_the_published_files_in_place(bench: Path, tmp_path: Path) -> None:
    from remote_corpus import mismatched_files
    from remote_corpus_fetch import fetch_family

    corpus, family = own_corpus(tmp_path)
    source = _published(tmp_path, family)
    for entry in family["files"]:
        (corpus / FAMILY / entry["file"]).unlink()
    assert fetch_family(FAMILY, family, corpus, source) == []
    assert mismatched_files(FAMILY, family, corpus) == []
    assert sorted(path.name for path in (corpus / FAMILY).iterdir()) == sorted(
        path.name for path in EXAMPLE.iterdir()
    )


def test_fetch_refuses_bytes_other_than_the_manifests(bench: Path, tmp_path: Path) -> None:
    from remote_corpus_fetch import fetch_family

    corpus, family = own_corpus(tmp_path)
    source = _published(tmp_path, family)
    changed = family["files"][0]
    mirror_file = tmp_path / "mirror" / "graphmend/tinylm" / family["commit"] / changed["path"]
    mirror_file.write_bytes(b"import os\nos.system('echo planted')\n")
    (corpus / FAMILY / changed["file"]).unlink()
    problems = fetch_family(FAMILY, family, corpus, source)
    assert len(problems) == 1
    assert problems[0].startswith(f"{FAMILY}/{changed['file']}: ")
    assert f"not the manifest's {changed['sha256']}; not written" in problems[0]
    assert not (corpus / FAMILY / changed["file"]).exists()
    assert not list((corpus / FAMILY).glob(".*.partial"))


def test_fetch_keeps_what_is_in_place_when_the_source_cannot_be_read(
    bench: Path, tmp_path: Path
) -> None:
    from remote_corpus import mismatched_files
    from remote_corpus_fetch import fetch_family

    corpus, family = own_corpus(tmp_path)
    missing = family["files"][0]["file"]
    (corpus / FAMILY / missing).unlink()
    source = (tmp_path / "nowhere").as_uri() + "/{repository}/{commit}/{path}"
    problems = fetch_family(FAMILY, family, corpus, source)
    assert [problem.split(": cannot read ")[0] for problem in problems] == [f"{FAMILY}/{missing}"]
    assert mismatched_files(FAMILY, family, corpus) == [missing]


def test_fetch_command_says_when_a_pattern_matches_no_family(bench: Path, tmp_path: Path) -> None:
    source = (tmp_path / "nowhere").as_uri() + "/{repository}/{commit}/{path}"
    script = str(BENCH / "remote_corpus_fetch.py")
    completed = run_python(script, "--only", "^no-such-family$", "--source", source)
    assert completed.returncode == 2
    assert completed.stderr.strip() == "no family matches '^no-such-family$'"


def test_a_family_runs_eagerly_under_the_hook_with_identical_output(
    bench: Path, tmp_path: Path
) -> None:
    import torch

    from measuring import compare

    corpus, _ = own_corpus(tmp_path)
    results = {}
    for arm in ("plain", "graphmend"):
        path = tmp_path / f"{arm}.pt"
        code = ARM.format(
            bench=str(bench), arm=arm, family=FAMILY, corpus=str(corpus), path=str(path)
        )
        env = {"HF_MODULES_CACHE": str(tmp_path / f"modules-{arm}"), "HF_HUB_OFFLINE": "1"}
        completed = run_python("-c", code, env=env, timeout=300)
        assert completed.returncode == 0, completed.stderr[-3000:]
        results[arm] = torch.load(path, weights_only=True)
    assert results["plain"]["loader"] == "SourceFileLoader"
    assert results["graphmend"]["loader"] == "GraphMendLoader"
    comparison = compare(results["plain"]["outputs"], results["graphmend"]["outputs"])
    assert comparison["identical"], comparison
    assert comparison["tensors"] > 0


def test_runner_reads_the_manifest_of_another_corpus(bench: Path, tmp_path: Path) -> None:
    corpus, family = own_corpus(tmp_path)
    changed = family["files"][0]["file"]
    (corpus / FAMILY / changed).write_bytes(b"\n")
    script = str(BENCH / "remote_corpus.py")
    completed = run_python(script, "--corpus", str(corpus), "--out", str(tmp_path / "out"))
    assert completed.returncode == 2
    assert f"({FAMILY}: {changed})" in completed.stderr
    assert not (tmp_path / "out").exists()
