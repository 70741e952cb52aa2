"""Real transformers model code under the hook: one graph, bit-identical to eager.

Each arm runs in its own process (tests/helpers/model_probe.py) so that the
"without GraphMend" numbers come from modules nobody rewrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from helpers.processes import run_python

PROBE = Path(__file__).parent / "helpers" / "model_probe.py"
TRANSFORMERS_4 = Version(transformers.__version__).major == 4

# transformers 4.x: BART and BioGPT warn from forward (logger.warning_once) when
# SDPA attention is asked for attention weights; every release runs remote code.
CASES = ["tiny_remote_model"]
if TRANSFORMERS_4:
    CASES += ["bart_sdpa_output_attentions", "biogpt_sdpa_output_attentions"]


@pytest.fixture(scope="session")
def probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    scratch = tmp_path_factory.mktemp("probe")
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(scratch / "hf_modules"),
        "GRAPHMEND_CACHE_DIR": str(scratch / "cache"),
    }
    results = {}
    for arm in ("plain", "graphmend"):
        child = run_python(str(PROBE), arm, *CASES, env=env)
        assert child.returncode == 0, child.stderr[-3000:]
        results[arm] = json.loads(child.stdout.strip().splitlines()[-1])
    return results


@pytest.mark.parametrize("case", CASES)
def test_model_breaks_without_graphmend(probes, case):
    plain = probes["plain"][case]
    assert plain["loader"] == "SourceFileLoader"
    assert plain["breaks"] > 0
    assert plain["fullgraph"] is False


@pytest.mark.parametrize("case", CASES)
def test_model_compiles_as_one_graph_with_graphmend_bit_identical(probes, case):
    mended = probes["graphmend"][case]
    assert mended["loader"] == "GraphMendLoader"
    assert (mended["graphs"], mended["breaks"]) == (1, 0)
    assert mended["fullgraph"] is True, mended.get("error")
    assert mended["identical"] is True
