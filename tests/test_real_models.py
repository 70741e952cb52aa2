"""Real transformers model code under the hook: one graph, bit-identical to eager.

Each arm runs in its own process (tests/helpers/model_probe.py) so that the
"without GraphMend" numbers come from modules nobody rewrote.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from helpers.model_probe import FAILING_INPUTS
from helpers.processes import offline_model_environment, run_python

PROBE = Path(__file__).parent / "helpers" / "model_probe.py"
TRANSFORMERS = Version(transformers.__version__)
TRANSFORMERS_4 = TRANSFORMERS.major == 4


@dataclass(frozen=True)
class Expect:
    """What a case shows: does fullgraph=True already work without GraphMend; does
    GraphMend remove every break (or only the ones in scope, leaving e.g. host
    reads for split sizes that fullgraph=True captures)."""

    plain_fullgraph: bool
    one_graph: bool = True


CASES: dict[str, Expect] = {
    # Logging from forward in a trust_remote_code model.
    "tiny_remote_model": Expect(plain_fullgraph=False),
    # `assert lengths.max().item() <= slen`: a host read that fullgraph=True
    # captures, but that breaks the graph under the default mode.
    "xlm_length_assert": Expect(plain_fullgraph=True),
    "flaubert_length_assert": Expect(plain_fullgraph=True),
    # `if duration_labels.sum() == 0: duration_labels[...] = 1`, an in-place update
    # of the caller's tensor, predicated; the rest of the function has
    # data-dependent shapes, which fullgraph=True captures.
    "fastspeech2_length_regulator_all_zero": Expect(plain_fullgraph=False, one_graph=False),
    "fastspeech2_length_regulator_durations": Expect(plain_fullgraph=False, one_graph=False),
}
if TRANSFORMERS_4:
    CASES |= {
        # BART and BioGPT warn from forward when SDPA is asked for attention weights.
        "bart_sdpa_output_attentions": Expect(plain_fullgraph=False),
        # `if (spatial_shapes[:, 0] * spatial_shapes[:, 1]).sum() != sequence_length:
        # raise ValueError(...)`.  Before 4.50 the attention's PyTorch path also splits
        # by level sizes read from the `spatial_shapes` tensor (host reads and data-dependent
        # sizes, which fullgraph=True captures and GraphMend leaves).
        "grounding_dino_spatial_shapes_guard": Expect(
            plain_fullgraph=False, one_graph=TRANSFORMERS.release >= (4, 50)
        ),
        # The float16 overflow clamp of the encoder layer, both outcomes.
        "bart_fp16_clamp_taken": Expect(plain_fullgraph=False),
        "bart_fp16_clamp_not_taken": Expect(plain_fullgraph=False),
        "marian_fp16_clamp_taken": Expect(plain_fullgraph=False),
    }
if TRANSFORMERS_4 and TRANSFORMERS.release >= (4, 45):  # BioGPT's SDPA attention came in 4.45
    CASES["biogpt_sdpa_output_attentions"] = Expect(plain_fullgraph=False)


@pytest.fixture(scope="session")
def probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    scratch = tmp_path_factory.mktemp("probe")
    env = offline_model_environment(scratch)
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
    assert plain["fullgraph"] is CASES[case].plain_fullgraph


@pytest.mark.parametrize("case", CASES)
def test_model_compiles_as_one_graph_with_graphmend_bit_identical(probes, case):
    mended, plain = probes["graphmend"][case], probes["plain"][case]
    assert mended["loader"] == "GraphMendLoader"
    if CASES[case].one_graph:
        assert (mended["graphs"], mended["breaks"]) == (1, 0)
    else:
        assert mended["graphs"] < plain["graphs"]
    assert mended["fullgraph"] is True, mended.get("error")
    assert mended["identical"] is True


@pytest.mark.parametrize("case", [case for case in CASES if case in FAILING_INPUTS])
def test_failing_guard_raises_the_original_exception_when_compiled(probes, case):
    failing = probes["graphmend"][case]["failing"]
    assert failing["eager"] is not None
    assert failing["compiled"] == failing["eager"]


# Phi-3's LongRoPE (transformers 4.x, modeling_rope_utils.longrope_frequency_update)
# re-registers ``inv_freq`` as ``long_inv_freq`` or ``original_inv_freq``, and
# ``original_inv_freq`` starts as the very tensor ``inv_freq`` is.  A predicated
# store that wrote the long frequencies into ``inv_freq`` in place also overwrote
# ``original_inv_freq``: every short input after a long one was wrong.
LONG_THEN_SHORT = """
import copy
import sys
import torch
if sys.argv[1] == "graphmend":
    import graphmend
    graphmend.install()
from transformers import Phi3Config, Phi3Model
config = Phi3Config(
    vocab_size=99, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    original_max_position_embeddings=8, pad_token_id=0,
    rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3] * 2,
                  "long_factor": [2.0, 2.5, 3.0, 3.5] * 2},
)
torch.manual_seed(0)
model = Phi3Model(config).eval()
compiled = torch.compile(copy.deepcopy(model), backend="eager")  # deepcopy keeps the aliasing
same = []
with torch.no_grad():
    for length in (12, 6, 12, 6):
        ids = torch.arange(length).unsqueeze(0) % 99
        expected = model(input_ids=ids).last_hidden_state
        same.append(torch.equal(compiled(input_ids=ids).last_hidden_state, expected))
print(type(sys.modules[Phi3Model.__module__].__loader__).__name__, same)
"""


@pytest.mark.skipif(not hasattr(transformers, "Phi3Config"), reason="no Phi-3 before 4.41")
@pytest.mark.parametrize("arm", ["plain", "graphmend"])
def test_phi3_longrope_long_then_short_inputs_match_eager(tmp_path, arm):
    child = run_python("-c", LONG_THEN_SHORT, arm, env=offline_model_environment(tmp_path))
    assert child.returncode == 0, child.stderr[-3000:]
    loader = "GraphMendLoader" if arm == "graphmend" else "SourceFileLoader"
    assert child.stdout.strip().splitlines()[-1] == f"{loader} [True, True, True, True]"


# transformers 4.4x-4.51 build Gemma 2's HybridCache inside forward when none is given,
# and its __init__ branches on `self.is_sliding[i]`, a tensor made from Python booleans:
# a graph break per layer (rewrites/from_python), then `mark_static_address`, which
# TorchDynamo refuses to trace (made after the graph).
HYBRID_CACHE = """
import inspect
import json
import sys
import torch
if sys.argv[1] == "graphmend":
    import graphmend
    graphmend.install()
from transformers import Gemma2Config, Gemma2ForCausalLM
config = Gemma2Config(
    vocab_size=99, hidden_size=32, intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
    max_position_embeddings=64, pad_token_id=0,
)
torch.manual_seed(0)
model = Gemma2ForCausalLM(config).eval()
ids = torch.arange(6).unsqueeze(0) % 99
with torch.no_grad():
    explained = torch._dynamo.explain(model)(input_ids=ids, use_cache=True)
    torch._dynamo.reset()
    expected = model(input_ids=ids, use_cache=True)
    compiled = torch.compile(model, backend="eager")(input_ids=ids, use_cache=True)
cache = compiled.past_key_values
print(json.dumps({
    "loader": type(sys.modules[Gemma2ForCausalLM.__module__].__loader__).__name__,
    "cache_breaks": sum("cache_utils" in str(r.user_stack) for r in explained.break_reasons),
    "graphs": explained.graph_count,
    "identical": torch.equal(compiled.logits, expected.logits),
    "shapes": [list(k.shape) for k in cache.key_cache],
    "expected_shapes": [list(k.shape) for k in expected.past_key_values.key_cache],
    "marked": [getattr(k, "_dynamo_static_input_type", None) for k in cache.key_cache],
}))
"""


def _hybrid_cache_of_4x() -> bool:
    cache = getattr(transformers, "HybridCache", None)
    return cache is not None and "self.is_sliding = torch.tensor(" in inspect.getsource(cache)


@pytest.mark.skipif(not _hybrid_cache_of_4x(), reason="HybridCache without a tensor of flags")
def test_gemma2_cache_built_in_forward_keeps_no_break_per_layer(tmp_path):
    arms = {}
    for arm in ("plain", "graphmend"):
        child = run_python("-c", HYBRID_CACHE, arm, env=offline_model_environment(tmp_path))
        assert child.returncode == 0, child.stderr[-3000:]
        arms[arm] = json.loads(child.stdout.strip().splitlines()[-1])
    plain, mended = arms["plain"], arms["graphmend"]
    assert (plain["loader"], mended["loader"]) == ("SourceFileLoader", "GraphMendLoader")
    assert plain["cache_breaks"] > 0
    assert mended["cache_breaks"] == 0
    assert mended["graphs"] < plain["graphs"]
    assert plain["identical"] and mended["identical"]
    assert mended["shapes"] == mended["expected_shapes"] == plain["shapes"]
    assert mended["marked"] == plain["marked"] == ["unguarded"] * 3
