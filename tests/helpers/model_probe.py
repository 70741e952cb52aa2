"""Child process for the real-model tests: build models, count graphs, compare outputs.

    python model_probe.py ARM CASE [CASE...]     (ARM: plain | graphmend)

Prints one JSON object: for each case, graphs and graph breaks under
``torch._dynamo.explain`` (breaks counted completely, from Dynamo's counters),
whether ``torch.compile(fullgraph=True)`` succeeds, and whether its output is
bit-identical to eager.  Weights come from a fixed seed, so both arms build the
same model.
"""

from __future__ import annotations

import inspect
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


def _bart_like_fp16(config_class, model_class, overflow: bool):
    config = config_class(
        vocab_size=99,
        d_model=16,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        attn_implementation="eager",
        pad_token_id=1,
        decoder_start_token_id=2,
    )
    model = model_class(config)
    if overflow:
        # Large feed-forward weights overflow float16 in the encoder layers:
        # the clamp branch is taken.
        for layer in model.encoder.layers:
            layer.fc2.weight.data.mul_(3000.0)
    encoder = model.get_encoder().half()
    return encoder, {"input_ids": _ids(99)}


@case
def bart_fp16_clamp_taken():
    from transformers import BartConfig, BartModel

    return _bart_like_fp16(BartConfig, BartModel, overflow=True)


@case
def bart_fp16_clamp_not_taken():
    from transformers import BartConfig, BartModel

    return _bart_like_fp16(BartConfig, BartModel, overflow=False)


@case
def marian_fp16_clamp_taken():
    from transformers import MarianConfig, MarianModel

    return _bart_like_fp16(MarianConfig, MarianModel, overflow=True)


class _LengthRegulator(torch.nn.Module):
    """FastSpeech2-Conformer's length_regulator, a module-level function, as a module."""

    probe_module = "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer"

    def forward(self, encoded_embeddings, duration_labels):
        from transformers.models.fastspeech2_conformer import (
            modeling_fastspeech2_conformer as module,
        )

        return module.length_regulator(encoded_embeddings, duration_labels)


def _length_regulator(durations: list[list[int]]):
    embeddings = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(3))
    return _LengthRegulator(), {
        "encoded_embeddings": embeddings,
        "duration_labels": torch.tensor(durations),
    }


@case
def fastspeech2_length_regulator_all_zero():
    # `if duration_labels.sum() == 0: duration_labels[...] = 1` is taken, and
    # updates the caller's tensor in place.
    return _length_regulator([[0, 0, 0], [0, 0, 0]])


@case
def fastspeech2_length_regulator_durations():
    return _length_regulator([[1, 2, 0], [2, 0, 1]])


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
        "level_start_index": torch.tensor([0, 16]),
    }
    if "spatial_shapes_list" in inspect.signature(attention.forward).parameters:  # 4.46 and later
        inputs["spatial_shapes_list"] = [(4, 4), (2, 2)]
    return attention, inputs


@case
def tiny_remote_model():
    from pathlib import Path

    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(__file__).resolve().parents[2] / "examples" / "tiny_remote_model"
    config = AutoConfig.from_pretrained(directory, trust_remote_code=True)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    return model, {"input_ids": _ids(config.vocab_size, (2, 16))}


# Inputs that fail a case's guard: a compiled call must raise what eager raises.
FAILING_INPUTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    # lengths longer than the sequence: `assert lengths.max().item() <= slen`
    "xlm_length_assert": lambda inputs: {**inputs, "lengths": torch.tensor([8, 7])},
    "flaubert_length_assert": lambda inputs: {**inputs, "lengths": torch.tensor([8, 7])},
    # 4*4 + 2*3 != 20 positions: `raise ValueError(...)`; same shapes, so the
    # compiled graph is reused and its lowered guard decides
    "grounding_dino_spatial_shapes_guard": lambda inputs: {
        **inputs,
        "spatial_shapes": torch.tensor([[4, 4], [2, 3]]),
    },
}


def _error(call: Callable[[], Any]) -> str | None:
    try:
        call()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def _leaves(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [leaf for value in output.values() for leaf in _leaves(value)]
    if isinstance(output, list | tuple):
        return [leaf for value in output for leaf in _leaves(value)]
    return []


def _bitwise_equal(left: torch.Tensor, right: torch.Tensor) -> bool:
    """Equal bit for bit (NaNs included), dtype and shape too."""
    if left.dtype != right.dtype or left.shape != right.shape:
        return False
    if left.is_floating_point():
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[left.element_size()]
        return torch.equal(left.contiguous().view(bits), right.contiguous().view(bits))
    return torch.equal(left, right)


def probe(name: str) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model, inputs = CASES[name]()
    model.eval()
    module_name = getattr(model, "probe_module", type(model).__module__)
    result: dict[str, Any] = {"module": module_name}
    import copy

    compiled_model = copy.deepcopy(model)
    compiled_inputs = copy.deepcopy(inputs)
    with torch.no_grad():
        eager = _leaves(model(**inputs))
        loader = getattr(sys.modules[module_name], "__loader__", None)
        result["loader"] = type(loader).__name__
        torch._dynamo.reset()
        counters.clear()
        explained = torch._dynamo.explain(model)(**inputs)
        result["graphs"] = explained.graph_count
        # explain() and Dynamo's counters each miss some breaks; take the larger.
        result["breaks"] = max(explained.graph_break_count, sum(counters["graph_break"].values()))
        torch._dynamo.reset()
        try:
            compiled_call = torch.compile(compiled_model, backend="aot_eager", fullgraph=True)
            compiled = _leaves(compiled_call(**compiled_inputs))
        except Exception as error:
            result["fullgraph"] = False
            result["error"] = str(error).splitlines()[0]
        else:
            result["fullgraph"] = True
            if name in FAILING_INPUTS:
                failing = FAILING_INPUTS[name](inputs)
                result["failing"] = {
                    "eager": _error(lambda: model(**failing)),
                    "compiled": _error(lambda: compiled_call(**failing)),
                }
            # Outputs, and the module's buffers (predicated stores write them in place).
            buffers = dict(model.named_buffers())
            compiled_buffers = dict(compiled_model.named_buffers())
            result["identical"] = (
                len(compiled) == len(eager)
                and all(_bitwise_equal(a, b) for a, b in zip(compiled, eager, strict=True))
                and buffers.keys() == compiled_buffers.keys()
                and all(_bitwise_equal(buffers[k], compiled_buffers[k]) for k in buffers)
                # inputs the model updates in place
                and all(
                    _bitwise_equal(inputs[k], compiled_inputs[k])
                    for k in inputs
                    if isinstance(inputs[k], torch.Tensor)
                )
            )
    return result


def main(arm: str, names: list[str]) -> None:
    if arm == "graphmend":
        import graphmend

        graphmend.install()
    print(json.dumps({name: probe(name) for name in names}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
