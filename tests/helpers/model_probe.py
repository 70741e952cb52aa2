"""Child process for the real-model tests: build models, count graphs, compare outputs.

    python model_probe.py ARM CASE [CASE...]     (ARM: plain | graphmend)

Prints one JSON object: for each case, graphs and graph breaks under
``torch._dynamo.explain`` (breaks counted completely, from Dynamo's counters),
whether ``torch.compile(fullgraph=True)`` succeeds, and whether its output is
bit-identical to eager.  Weights come from a fixed seed, so both arms build the
same model.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch

CASES: dict[str, Callable[[], tuple[torch.nn.Module, dict[str, Any]]]] = {}


def case(function: Callable[[], tuple[torch.nn.Module, dict[str, Any]]]) -> Callable[..., Any]:
    CASES[function.__name__] = function
    return function


def _ids(vocab: int, shape: tuple[int, int] = (2, 7)) -> torch.Tensor:
    return torch.randint(3, vocab, shape, generator=torch.Generator().manual_seed(1))


@case
def bart_sdpa_output_attentions():
    from transformers import BartConfig, BartModel

    config = BartConfig(
        vocab_size=99,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    return BartModel(config), {"input_ids": _ids(99), "output_attentions": True}


@case
def biogpt_sdpa_output_attentions():
    from transformers import BioGptConfig, BioGptModel

    config = BioGptConfig(
        vocab_size=99,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    return BioGptModel(config), {"input_ids": _ids(99), "output_attentions": True}


@case
def xlm_length_assert():
    from transformers import XLMConfig, XLMModel

    config = XLMConfig(vocab_size=99, emb_dim=16, n_layers=2, n_heads=2, max_position_embeddings=64)
    return XLMModel(config), {"input_ids": _ids(99)}


@case
def flaubert_length_assert():
    from transformers import FlaubertConfig, FlaubertModel

    config = FlaubertConfig(
        vocab_size=99, emb_dim=16, n_layers=2, n_heads=2, max_position_embeddings=64
    )
    return FlaubertModel(config), {"input_ids": _ids(99)}


@case
def grounding_dino_spatial_shapes_guard():
    from transformers import GroundingDinoConfig
    from transformers.models.grounding_dino import modeling_grounding_dino as module

    config = GroundingDinoConfig(d_model=16, num_feature_levels=2, disable_custom_kernels=True)
    attention = module.GroundingDinoMultiscaleDeformableAttention(config, num_heads=2, n_points=2)
    shapes = torch.tensor([[4, 4], [2, 2]])
    generator = torch.Generator().manual_seed(2)
    inputs = {
        "hidden_states": torch.randn(1, 3, 16, generator=generator),
        "encoder_hidden_states": torch.randn(1, 20, 16, generator=generator),
        "reference_points": torch.rand(1, 3, 2, 2, generator=generator),
        "spatial_shapes": shapes,
        "spatial_shapes_list": [(4, 4), (2, 2)],
        "level_start_index": torch.tensor([0, 16]),
    }
    return attention, inputs


@case
def tiny_remote_model():
    from pathlib import Path

    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(__file__).resolve().parents[2] / "examples" / "tiny_remote_model"
    config = AutoConfig.from_pretrained(directory, trust_remote_code=True)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    return model, {"input_ids": _ids(config.vocab_size, (2, 16))}


def _leaves(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [leaf for value in output.values() for leaf in _leaves(value)]
    if isinstance(output, list | tuple):
        return [leaf for value in output for leaf in _leaves(value)]
    return []


def probe(name: str) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model, inputs = CASES[name]()
    model.eval()
    result: dict[str, Any] = {"module": type(model).__module__}
    loader = getattr(sys.modules[type(model).__module__], "__loader__", None)
    result["loader"] = type(loader).__name__
    with torch.no_grad():
        eager = _leaves(model(**inputs))
        torch._dynamo.reset()
        counters.clear()
        explained = torch._dynamo.explain(model)(**inputs)
        result["graphs"] = explained.graph_count
        # explain() and Dynamo's counters each miss some breaks; take the larger.
        result["breaks"] = max(explained.graph_break_count, sum(counters["graph_break"].values()))
        torch._dynamo.reset()
        try:
            compiled = _leaves(torch.compile(model, backend="aot_eager", fullgraph=True)(**inputs))
        except Exception as error:
            result["fullgraph"] = False
            result["error"] = str(error).splitlines()[0]
        else:
            result["fullgraph"] = True
            result["identical"] = len(compiled) == len(eager) and all(
                torch.equal(a, b) for a, b in zip(compiled, eager, strict=True)
            )
    return result


def main(arm: str, names: list[str]) -> None:
    if arm == "graphmend":
        import graphmend

        graphmend.install()
    print(json.dumps({name: probe(name) for name in names}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
