"""Graph-break census of transformers, with and without GraphMend.

Every model type in transformers' auto mappings (seq2seq LM, causal LM, masked
LM, image classification, sequence classification, base model) is built from a
tiny config with random weights and run, in fp32 and in one half precision,
eagerly, under ``torch._dynamo.explain`` (default mode, backend "eager") and
under ``torch.compile(fullgraph=True)`` (backend "eager"; ``--backend
aot_eager`` adds AOTAutograd, at about twice the compile time): once plainly
and once after ``graphmend.install()``.  Each arm runs in its own process;
the first saves the weights and inputs, the second loads them with
``strict=True``.  Outputs are compared bitwise: compiled against eager in
each arm, and eager against eager across the arms.

    python bench/census.py [--only REGEX] [--jobs N] [--dtype float32,float16]
                           [--backend eager] [--timeout S] [--out DIR] [--resume]

Writes ``census.json`` (everything), ``census.md`` and ``breaks.png`` to
``--out`` (default ``bench/results/census-<transformers version>/``);
``bench/census_report.py`` renders them and documents the break categories.
Each finished model is appended to ``census.partial.jsonl`` there at once;
``--resume`` keeps those results and measures only the model types missing
from it (the journal is removed when the run completes).

The measuring itself (eager run, breaks with reasons and locations,
``fullgraph=True``, bitwise comparison) is ``measuring.py``, which
``remote_corpus.py`` shares.

Every ``--jobs`` slot has one server process per arm that imports torch and
transformers once (the GraphMend server calls ``graphmend.install()`` first)
and forks a fresh child for each model, so the arms of a model run in separate
processes without paying for the imports each time.  Models that cannot be
built or run generically are kept in the results with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import inspect
import json
import os
import queue
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from census_report import failure_reason, write_report
from machine import environment
from measuring import compare, describe, forward, measure, timed

ARMS = ("plain", "graphmend")
DTYPES = ("float32", "float16", "bfloat16")
JOURNAL = "census.partial.jsonl"

#: Auto mappings, in the order in which a model type's class is chosen.
HEAD_MAPPINGS = (
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("sequence-classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    ("base", "MODEL_MAPPING_NAMES"),
)

#: Config levels, tried in order: everything small, only fewer layers, class defaults.
LEVELS = ("tiny", "shallow", "default")
MAX_PARAMETERS = 50_000_000
#: Address-space limit of each model's child process, so that a model too big
#: for the machine fails with MemoryError instead of waking the OOM killer.
MEMORY_LIMIT = 8 << 30

BATCH, SEQUENCE, DECODER_SEQUENCE, PADDING = 2, 16, 8, 3
#: Forward arguments ``make_input`` can generate.
GENERIC_INPUTS = (
    "input_ids",
    "attention_mask",
    "decoder_input_ids",
    "pixel_values",
    "pixel_values_videos",
    "input_values",
    "input_features",
)
AUDIO_SAMPLES, AUDIO_FRAMES, DEFAULT_IMAGE_SIZE = 4800, 64, 64
WIDTH, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 64, 2, 4, 2, 8, 99

#: Layer counts: shrunk at the "tiny" and "shallow" levels.
LAYER_SIZES: dict[str, int] = dict.fromkeys(
    (
        "num_hidden_layers",
        "num_layers",
        "n_layer",
        "n_layers",
        "encoder_layers",
        "decoder_layers",
        "num_encoder_layers",
        "num_decoder_layers",
        "decoder_num_layers",
        "decoder_num_hidden_layers",
        "depth",
    ),
    LAYERS,
)

#: Other scalar sizes, shrunk at the "tiny" level.  One value per role keeps
#: linked sizes equal (a projector's output and the text model's width, say).
TINY_SIZES: dict[str, int] = {
    **LAYER_SIZES,
    **dict.fromkeys(
        (
            "hidden_size",
            "d_model",
            "n_embd",
            "n_embed",
            "embed_dim",
            "dim",
            "model_dim",
            "d_embed",
            "embedding_size",
            "word_embed_proj_dim",
            "projection_dim",
            "text_hidden_size",
            "encoder_hidden_size",
            "decoder_hidden_size",
            "out_hidden_size",
            "output_hidden_size",
            "audio_hidden_size",
            "projector_hidden_size",
            "vision_embed_dim",
            "text_embed_dim",
            "hidden_size_per_layer_input",
            "emb_dim",
            "d_latents",
            "output_channels",
        ),
        WIDTH,
    ),
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "d_ff",
            "n_inner",
            "mlp_dim",
            "hidden_dim",
            "decoder_intermediate_size",
            "ffn_hidden_size",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "shared_intermediate_size",
        ),
        FFN,
    ),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "n_heads",
            "num_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_num_attention_heads",
            "decoder_num_attention_heads",
            "attention_heads",
            "linear_num_value_heads",
        ),
        HEADS,
    ),
    **dict.fromkeys(("linear_num_key_heads", "num_kv_heads"), KV_HEADS),
    **dict.fromkeys(
        ("head_dim", "d_kv", "v_head_dim", "dim_head", "linear_key_head_dim"), HEAD_DIM
    ),
    **dict.fromkeys(("linear_value_head_dim", "kv_lora_rank", "q_lora_rank"), 2 * HEAD_DIM),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "rotary_dim"), HEAD_DIM // 2),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "moe_k"), 2),
    # Jamba-style hybrids: every second layer attention, every second layer MoE.
    **dict.fromkeys(("attn_layer_period", "expert_layer_period"), 2),
    **dict.fromkeys(("attn_layer_offset", "expert_layer_offset"), 1),
    **dict.fromkeys(
        (
            "n_group",
            "topk_group",
            "n_shared_experts",
            "num_shared_experts",
            "moe_num_shared_experts",
            "n_groups",
            "mamba_n_groups",
        ),
        1,
    ),
    "attention_window": 4,
}

#: Integer lists shrunk at the "tiny" level: per-stage depths and head counts to
#: 1, per-stage widths divided by one factor (so their ratios stay).
TINY_DEPTH_LISTS = frozenset({"depths", "stage_num_blocks", "blocks_per_stage"})
TINY_HEAD_LISTS = frozenset(
    {"num_heads", "num_attention_heads", "num_attention_heads_per_stage", "attention_window"}
)
TINY_WIDTH_LISTS = frozenset(
    {"hidden_sizes", "embed_dim_per_stage", "neck_hidden_sizes", "conv_dim"}
)
#: (heads, head size, expansion) attribute triples of Mamba-2 style mixers.
_MAMBA_HEADS = (
    ("num_heads", "head_dim", "expand"),
    ("mamba_n_heads", "mamba_d_head", "mamba_expand"),
)
#: The rotary sections Qwen2-VL style models assume when their config has none.
_DEFAULT_MROPE_SECTION = (16, 24, 24)
_LAYER_INDEX_KEY = re.compile(r"(_indexes|_indices|_idxs)$")
_SPECIAL_TOKEN_KEY = re.compile(r"(_token_id|_token_index)$")
_LARGEST_SPECIAL_TOKEN = 300_000


# -- tiny configs ----------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(item) for item in value)


def _is_subconfig(value: Any) -> bool:
    return isinstance(value, dict) and "model_type" in value


def special_tokens(values: dict[str, Any]) -> set[int]:
    """Every special-token id (``*_token_id``, ``*_token_index``) anywhere in a config dict."""
    found: set[int] = set()
    for key, value in values.items():
        if _is_subconfig(value):
            found |= special_tokens(value)
        elif _SPECIAL_TOKEN_KEY.search(key):
            ids = value if _is_int_list(value) else [value] if _is_int(value) else []
            found.update(i for i in ids if 0 <= i < _LARGEST_SPECIAL_TOKEN)
    return found


def _shrunk_list(key: str, value: list[int]) -> list[int] | None:
    """A smaller per-stage list for the "tiny" level, or None to keep ``value``."""
    if key in TINY_DEPTH_LISTS:
        return [min(item, 1) for item in value]
    if key in TINY_HEAD_LISTS:
        return [min(item, 4 if key == "attention_window" else 1) for item in value]
    if key in TINY_WIDTH_LISTS:
        factor = max(1, min(value) // 16)
        return [max(8, item // factor) for item in value]
    return None


def _scalar_changes(values: dict[str, Any], level: str, vocab: int) -> dict[str, Any]:
    """The scalar and per-stage-list attributes this level shrinks (never grows).

    A ``head_dim`` of None (derived from the width) is set explicitly at the
    "tiny" level, to the value it would be derived as.
    """
    rules = TINY_SIZES if level == "tiny" else LAYER_SIZES
    changed: dict[str, Any] = {}
    for key, value in values.items():
        if level == "tiny" and key == "head_dim" and value is None:
            changed[key] = HEAD_DIM
        elif _is_int(value) and key in rules and value > rules[key]:
            changed[key] = rules[key]
        elif _is_int(value) and key in ("vocab_size", "vocab_size_per_layer_input"):
            if value > vocab:
                changed[key] = vocab
        elif level == "tiny" and _is_int_list(value):
            shrunk = _shrunk_list(key, value)
            if shrunk is not None and shrunk != value:
                changed[key] = shrunk
    return changed


def _first_layers(value: list[Any], count: int) -> list[Any]:
    """The first ``count`` entries of a per-layer list, keeping one layer of each kind.

    In a list of layer kinds (strings), kinds missing from the first entries (a
    hybrid model's attention layers after its linear-attention ones, say)
    replace the last entries kept.
    """
    kept = value[:count]
    if all(isinstance(item, str) for item in value):
        missing = [kind for kind in dict.fromkeys(value) if kind not in kept]
        for index, kind in enumerate(missing[: count - 1]):
            kept[count - 1 - index] = kind
    return kept


def _follow_layer_counts(values: dict[str, Any], changed: dict[str, Any]) -> None:
    """Shorten per-layer lists, clip layer indices, drop per-layer dict entries past the end.

    Backbone stage selections (``out_features``, ``out_indices``) are left alone.
    """
    counts = {values[key]: changed[key] for key in LAYER_SIZES if key in changed}
    if not counts:
        return
    layers = min(counts.values())
    for key, value in values.items():
        if key in changed or key.startswith("out_"):
            continue
        if isinstance(value, list) and len(value) in counts and len(value) > counts[len(value)]:
            changed[key] = _first_layers(value, counts[len(value)])
        elif _is_int_list(value) and _LAYER_INDEX_KEY.search(key):
            clipped = list(dict.fromkeys(min(item, layers - 1) for item in value))
            if clipped != value:
                changed[key] = clipped
        elif (
            "layer" in key and isinstance(value, dict) and value and all(map(_is_layer_key, value))
        ):
            changed[key] = {k: v for k, v in value.items() if int(k) < layers}


def _is_layer_key(key: Any) -> bool:
    return _is_int(key) or (isinstance(key, str) and key.isdigit())


def _follow_head_sizes(values: dict[str, Any], changed: dict[str, Any]) -> None:
    """Keep head-size relations of the defaults.

    Multi-head attention stays multi-head (key/value heads follow the heads);
    a ``head_dim`` equal to ``qk_rope_head_dim`` (DeepSeek) stays equal to it;
    heads x head size = expand x width stays true (Mamba 2); multimodal rotary
    sections sum to half a head, including the section a model assumes when
    its config has none (the config class exempts ``mrope_section`` from rope
    validation).
    """
    heads = changed.get("num_attention_heads")
    kv_heads = values.get("num_key_value_heads")
    if heads is not None and _is_int(kv_heads):
        same = kv_heads == values["num_attention_heads"]
        changed["num_key_value_heads"] = heads if same else min(kv_heads, KV_HEADS)
    rope_dim = values.get("qk_rope_head_dim")
    if _is_int(rope_dim) and values.get("head_dim") == rope_dim and "qk_rope_head_dim" in changed:
        changed["head_dim"] = changed["qk_rope_head_dim"]
    for heads_key, size_key, expand_key in _MAMBA_HEADS:
        sizes = [values.get(key) for key in (heads_key, size_key, expand_key, "hidden_size")]
        if all(_is_int(size) for size in sizes) and sizes[0] * sizes[1] == sizes[2] * sizes[3]:
            changed[heads_key] = HEADS
            changed[size_key] = sizes[2] * WIDTH // HEADS
    for key in ("rope_scaling", "rope_parameters"):
        rope = values.get(key)
        if isinstance(rope, dict) and (_is_int_list(rope.get("mrope_section")) or _mrope(values)):
            parts = len(rope.get("mrope_section") or _DEFAULT_MROPE_SECTION)
            head_dim = changed.get("head_dim", HEAD_DIM)
            changed[key] = {**rope, "mrope_section": _split_evenly(head_dim // 2, parts)}


def _mrope(values: dict[str, Any]) -> bool:
    """Whether the config class of ``values`` exempts ``mrope_section`` from rope validation."""
    from transformers import CONFIG_MAPPING

    model_type = values.get("model_type", "")
    if model_type not in CONFIG_MAPPING:
        return False
    exempt = getattr(CONFIG_MAPPING[model_type], "ignore_keys_at_rope_validation", ())
    return "mrope_section" in exempt


def _split_evenly(total: int, parts: int) -> list[int]:
    return [total // parts + (index < total % parts) for index in range(parts)]


def _follow_image_size(values: dict[str, Any], changed: dict[str, Any]) -> None:
    """Shrink square images to 8 x 8 patches (64 pixels without a patch size)."""
    size, patch = values.get("image_size"), values.get("patch_size")
    target = 8 * patch if _is_int(patch) else DEFAULT_IMAGE_SIZE
    if _is_int(size) and size > target:
        changed["image_size"] = target
    elif _is_int_list(size) and max(size) > target:
        changed["image_size"] = [min(item, target) for item in size]


def own_settings(config: Any) -> dict[str, Any]:
    """The attributes of a (sub-)config that differ from its class's defaults.

    A parent config that builds a sub-config with settings of its own (LLaVA's
    CLIP tower, say) passes them here; values derived from other attributes
    (SAM's ``image_embedding_size``) match the class defaults and are left out,
    so the sub-config derives them again from the shrunk sizes.
    """
    try:
        defaults = type(config)().to_dict()
    except Exception:
        defaults = {}
    missing = object()
    own = {k: v for k, v in config.to_dict().items() if defaults.get(k, missing) != v}
    return {"model_type": config.model_type, **own}


def shrink(config: Any, level: str, vocab: int) -> dict[str, Any]:
    """Keyword arguments that turn ``config`` into its ``level`` version.

    Only changed attributes are returned; a changed sub-config comes as a dict
    of its own settings plus its changes, recursively.
    """
    if level == "default":
        return {}
    values = config.to_dict()
    changed = _scalar_changes(values, level, vocab)
    _follow_layer_counts(values, changed)
    if level == "tiny":
        _follow_head_sizes(values, changed)
        _follow_image_size(values, changed)
    for key, value in values.items():
        subconfig = getattr(config, key, None) if isinstance(value, dict) else None
        if hasattr(subconfig, "to_dict") and hasattr(subconfig, "model_type"):
            inner = shrink(subconfig, level, vocab)
            if inner:
                changed[key] = {**own_settings(subconfig), **inner}
    return changed


def config_overrides(model_type: str, level: str) -> dict[str, Any]:
    """Keyword arguments that turn the model type's default config into ``level``."""
    from transformers import CONFIG_MAPPING

    defaults = CONFIG_MAPPING[model_type]()
    vocab = max(VOCAB, max(special_tokens(defaults.to_dict()), default=-1) + 1)
    return shrink(defaults, level, vocab)


def build_config(model_type: str, overrides: dict[str, Any]) -> Any:
    """The model type's config class instantiated with ``overrides``."""
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type](**overrides)


# -- models and inputs -----------------------------------------------------------------------


def model_types(pattern: str | None) -> list[str]:
    """Model types in the auto mappings of ``HEAD_MAPPINGS`` matching ``pattern``."""
    from transformers.models.auto import modeling_auto

    found = set()
    for _, attribute in HEAD_MAPPINGS:
        found.update(getattr(modeling_auto, attribute))
    return sorted(t for t in found if pattern is None or re.search(pattern, t))


def head_candidates(model_type: str) -> list[tuple[str, str]]:
    """(head, class name) pairs for a model type, in ``HEAD_MAPPINGS`` order."""
    from transformers.models.auto import modeling_auto

    candidates: list[tuple[str, str]] = []
    for head, attribute in HEAD_MAPPINGS:
        name = getattr(modeling_auto, attribute).get(model_type)
        if isinstance(name, (list, tuple)):
            name = name[0]
        if name and name not in (known for _, known in candidates):
            candidates.append((head, name))
    return candidates


def parameter_count(model_class: type, config: Any) -> int:
    """Parameters of the model, counted on the meta device."""
    with torch.device("meta"):
        return sum(p.numel() for p in model_class(config).parameters())


def build_model(class_name: str, config: Any, level: str) -> torch.nn.Module:
    """An fp32 model in eval mode with seeded random weights, within ``MAX_PARAMETERS``.

    Above the "tiny" level the size must be known first: a model that cannot
    be built on the meta device is not built for real either.
    """
    import transformers

    model_class = getattr(transformers, class_name)
    try:
        size = parameter_count(model_class, config)
    except Exception:
        if level != "tiny":
            raise
    else:
        if size > MAX_PARAMETERS:
            raise ValueError(f"{size / 1e6:.0f}M parameters (limit {MAX_PARAMETERS / 1e6:.0f}M)")
    torch.manual_seed(0)
    return model_class(config).float().eval()


def _lookup(config: Any, name: str, prefer: tuple[str, ...] = ()) -> Any:
    """``config.<name>``, looked up first in the ``prefer`` sub-configs, then in any."""
    subconfigs = [getattr(config, attribute, None) for attribute in prefer]
    subconfigs += [config]
    subconfigs += [value for value in vars(config).values() if hasattr(value, "to_dict")]
    for candidate in subconfigs:
        value = getattr(candidate, name, None) if candidate is not None else None
        if value is not None:
            return value
    return None


def token_ids(config: Any, length: int, generator: torch.Generator) -> torch.Tensor:
    """Random token ids below the (text) vocabulary size that are not special tokens."""
    vocab = _lookup(config, "vocab_size", ("text_config", "decoder"))
    allowed = torch.ones(vocab if _is_int(vocab) else VOCAB, dtype=torch.bool)
    allowed[[i for i in special_tokens(config.to_dict()) if i < len(allowed)]] = False
    candidates = allowed.nonzero().flatten()
    return candidates[torch.randint(len(candidates), (BATCH, length), generator=generator)]


def image(config: Any, generator: torch.Generator) -> torch.Tensor:
    """Random pixels shaped by the (vision) config: channels, image size, frames."""
    prefer = ("vision_config", "backbone_config")
    channels = _lookup(config, "num_channels", prefer) or 3
    size = _lookup(config, "image_size", prefer) or DEFAULT_IMAGE_SIZE
    height, width = (size, size) if _is_int(size) else tuple(size)[:2]
    frames = _lookup(config, "num_frames", prefer)
    shape = (BATCH, channels, height, width)
    if _is_int(frames):
        shape = (BATCH, frames, channels, height, width)
    return torch.randn(shape, generator=generator)


def audio_features(config: Any, generator: torch.Generator) -> torch.Tensor:
    """Random log-mel features: Whisper's (batch, mels, frames) or (batch, frames, features)."""
    mels = _lookup(config, "num_mel_bins", ("audio_config", "encoder"))
    positions = _lookup(config, "max_source_positions", ("audio_config", "encoder"))
    if _is_int(mels) and _is_int(positions):
        return torch.randn(BATCH, mels, 2 * positions, generator=generator)
    features = mels or _lookup(config, "feature_size") or _lookup(config, "input_feat_per_channel")
    return torch.randn(BATCH, AUDIO_FRAMES, features or 80, generator=generator)


def make_input(name: str, config: Any, generator: torch.Generator) -> torch.Tensor:
    """One generic model input by its forward-argument name."""
    if name == "input_ids":
        return token_ids(config, SEQUENCE, generator)
    if name == "decoder_input_ids":
        return token_ids(config, DECODER_SEQUENCE, generator)
    if name == "attention_mask":
        mask = torch.ones(BATCH, SEQUENCE, dtype=torch.long)
        mask[1, -PADDING:] = 0
        return mask
    if name in ("pixel_values", "pixel_values_videos"):
        return image(config, generator)
    if name == "input_values":
        return torch.randn(BATCH, AUDIO_SAMPLES, generator=generator)
    if name == "input_features":
        return audio_features(config, generator)
    raise ValueError(f"no generic input for forward argument {name!r}")


def input_variants(model: torch.nn.Module) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """Input sets to try, in order, among those that give every required argument.

    "main": the main input and any other required input of ``GENERIC_INPUTS``
    (with an attention mask for token ids, decoder ids for encoder-decoders);
    "main, 3-D audio": raw audio shaped (batch, 1, samples); "main+pixels":
    pixels too (a multimodal model that runs text-only is measured text-only).
    """
    parameters = inspect.signature(model.forward).parameters
    required = {
        name
        for name, parameter in parameters.items()
        if parameter.default is parameter.empty
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }
    main = model.main_input_name
    names = [main, *(name for name in GENERIC_INPUTS if name in required and name != main)]
    if "input_ids" in names and "attention_mask" in parameters:
        names.append("attention_mask")
    if getattr(model.config, "is_encoder_decoder", False) and "decoder_input_ids" in parameters:
        names.append("decoder_input_ids")
    names = list(dict.fromkeys(names))
    missing = sorted(required - {*names, "pixel_values"})
    if missing:
        raise ValueError(f"forward requires {', '.join(missing)}")
    generator = torch.Generator().manual_seed(0)
    base = {name: make_input(name, model.config, generator) for name in names}
    variants = [("main", base)]
    if main == "input_values":
        variants.append(("main, 3-D audio", {**base, main: base[main][:, None]}))
    if "pixel_values" not in names and "pixel_values" in parameters:
        variants.append(("main+pixels", {**base, "pixel_values": image(model.config, generator)}))
    return [(label, inputs) for label, inputs in variants if required <= inputs.keys()]


# -- one arm of one model (runs in a forked child) -------------------------------------------


@dataclasses.dataclass
class Subject:
    """A model ready to measure: module, inputs and how they were chosen."""

    model: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    choice: dict[str, str]


class NotBuilt(Exception):
    """No class, config level and input set of the model type could be built and run."""

    def __init__(self, status: str, attempts: list[dict[str, Any]]) -> None:
        super().__init__(status)
        self.status = status
        self.attempts = attempts


def distinct_levels(model_type: str) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    """Each config level with its overrides (or the error computing them), duplicates skipped."""
    seen: list[dict[str, Any]] = []
    for level in LEVELS:
        try:
            overrides = config_overrides(model_type, level)
        except Exception as error:
            yield level, error
            continue
        if overrides not in seen:
            seen.append(overrides)
            yield level, overrides


def choose_subject(model_type: str) -> tuple[Subject, list[dict[str, Any]]]:
    """The first (level, class, inputs) that builds and runs eagerly in fp32.

    Raises :class:`NotBuilt` with every attempt when none does: status
    ``not_built`` if no model could be constructed, ``not_run`` otherwise.
    """
    attempts: list[dict[str, Any]] = []
    constructed = False
    for level, overrides in distinct_levels(model_type):
        try:
            if isinstance(overrides, Exception):
                raise overrides
            config = build_config(model_type, overrides)
        except Exception as error:
            attempts.append({"level": level, "stage": "config", **describe(error)})
            continue
        for head, class_name in head_candidates(model_type):
            choice = {"level": level, "head": head, "class": class_name}
            try:
                model = build_model(class_name, config, level)
                variants = input_variants(model)
            except Exception as error:
                attempts.append({**choice, "stage": "build", **describe(error)})
                continue
            constructed = True
            for label, inputs in variants:
                try:
                    forward(model, inputs)
                except Exception as error:
                    attempts.append(
                        {**choice, "inputs": label, "stage": "eager", **describe(error)}
                    )
                    continue
                return Subject(model, inputs, {**choice, "inputs": label}), attempts
    raise NotBuilt("not_run" if constructed else "not_built", attempts)


def rebuild_subject(model_type: str, choice: dict[str, str], state_path: Path) -> Subject:
    """The first arm's subject, rebuilt from its choice, weights loaded with ``strict=True``."""
    config = build_config(model_type, config_overrides(model_type, choice["level"]))
    model = build_model(choice["class"], config, choice["level"])
    saved = torch.load(state_path, weights_only=True)
    model.load_state_dict(saved["state_dict"], strict=True)
    return Subject(model, saved["inputs"], choice)


def run_arm(job: dict[str, Any]) -> dict[str, Any]:
    """Everything one arm measures for one model type; the result is JSON-ready."""
    folder = Path(job["folder"])
    first = job["choice"] is None
    result: dict[str, Any] = {"arm": job["arm"], "status": "ok"}
    with timed(result, "build"):
        try:
            if first:
                chosen, result["attempts"] = choose_subject(job["model_type"])
                state = {"state_dict": chosen.model.state_dict(), "inputs": chosen.inputs}
                torch.save(state, folder / "state.pt")
            # both arms measure a model rebuilt the same way: the chosen one has run once,
            # and what it cached in plain attributes (LeViT's attention biases, in float32)
            # would leak into its float16 run
            choice = chosen.choice if first else job["choice"]
            subject = rebuild_subject(job["model_type"], choice, folder / "state.pt")
        except NotBuilt as failure:
            return {**result, "status": failure.status, "attempts": failure.attempts}
        except Exception as error:
            return {**result, "status": "error", "error": describe(error)}
    result["choice"] = subject.choice
    result["loader"] = type(sys.modules[type(subject.model).__module__].__loader__).__name__
    result["parameters"] = sum(p.numel() for p in subject.model.parameters())
    result["inputs"] = {name: list(value.shape) for name, value in subject.inputs.items()}
    reference = {} if first else torch.load(folder / "outputs.pt", weights_only=True)
    runs, outputs, sites = {}, {}, {}
    for dtype in job["dtypes"]:
        runs[dtype], outputs[dtype] = measure(
            subject.model, subject.inputs, dtype, job["backend"], sites
        )
        if reference.get(dtype, {}).get("eager") and "eager" in outputs[dtype]:
            runs[dtype]["eager_same_as_first_arm"] = compare(
                reference[dtype]["eager"], outputs[dtype]["eager"]
            )
    if first:
        torch.save(outputs, folder / "outputs.pt")
    result["runs"] = runs
    return result


# -- arm servers -----------------------------------------------------------------------------


def prepare_arm(arm: str, backend: str) -> None:
    """Import what every model needs (after installing GraphMend in its arm) and warm Dynamo."""
    if arm == "graphmend":
        import graphmend

        graphmend.install()
    import torch._dynamo
    import transformers.modeling_utils
    import transformers.models.auto.modeling_auto  # noqa: F401

    torch.set_num_threads(1)
    torch.compile(torch.sin, fullgraph=True, backend=backend)(torch.ones(2))
    torch._dynamo.reset()


def run_child(job: dict[str, Any]) -> None:
    """In a forked child: run one arm with output going to the job's log; never returns."""
    code = 1
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        with open(os.devnull) as devnull, open(job["log"], "w") as log:
            os.dup2(devnull.fileno(), 0)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        result = run_arm(job)
        Path(job["result"]).write_text(json.dumps(result))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def wait_for(pid: int, timeout: float) -> dict[str, Any]:
    """Wait for a child; kill it after ``timeout`` seconds.  Returns how it ended."""
    started = time.perf_counter()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        elapsed = time.perf_counter() - started
        if done:
            return {"exit": os.waitstatus_to_exitcode(status), "seconds": round(elapsed, 1)}
        if elapsed > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"exit": None, "timed_out": True, "seconds": round(elapsed, 1)}
        time.sleep(0.05)


def serve(arm: str, backend: str) -> None:
    """Arm server: read jobs as JSON lines on stdin, fork a child per job, reply on stdout."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    prepare_arm(arm, backend)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(job)
        replies.write(json.dumps(wait_for(pid, job["timeout"])) + "\n")
        replies.flush()


class ArmServer:
    """The orchestrator's handle on one arm server process (restarted if it dies)."""

    def __init__(self, arm: str, options: argparse.Namespace, env: dict[str, str], log: Path):
        self.command = [sys.executable, __file__, "--serve", arm, "--backend", options.backend]
        self.env = env
        self.log = log
        self.process: subprocess.Popen[str] | None = None

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """Send one job and wait for the server's reply."""
        if self.process is None or self.process.poll() is not None:
            self._start()
        assert self.process is not None and self.process.stdin and self.process.stdout
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
            reply = self.process.stdout.readline()
        except (BrokenPipeError, OSError):
            reply = ""
        if not reply:
            self.process = None
            return {"exit": None, "server_log": log_tail(self.log)}
        return json.loads(reply)

    def _start(self) -> None:
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=self.env,
            )

    def close(self) -> None:
        """End the server (it exits when its stdin closes)."""
        if self.process is not None and self.process.stdin:
            self.process.stdin.close()
            self.process.wait()


# -- orchestration ---------------------------------------------------------------------------


def log_tail(path: Path, characters: int = 2000) -> str:
    """The end of a child's log."""
    try:
        return path.read_text(errors="replace")[-characters:]
    except OSError:
        return ""


def arm_outcome(reply: dict[str, Any], result_path: Path, log_path: Path) -> dict[str, Any]:
    """The arm's result, or why there is none (timeout, crash) with the end of its log."""
    if reply.get("exit") == 0 and result_path.exists():
        outcome = json.loads(result_path.read_text())
    elif reply.get("timed_out"):
        outcome = {"status": "timeout"}
    else:
        outcome = {"status": "crashed", "exit": reply.get("exit")}
    outcome["wall_seconds"] = reply.get("seconds")
    if outcome["status"] not in ("ok", "not_built", "not_run"):
        outcome["log_tail"] = reply.get("server_log") or log_tail(log_path)
    return outcome


def census_model(
    model_type: str, servers: dict[str, ArmServer], options: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """Both arms of one model type, the second only if the first measured it."""
    started = time.perf_counter()
    folder = workdir / model_type
    folder.mkdir()
    result: dict[str, Any] = {"model_type": model_type, "status": "ok", "arms": {}}
    choice = None
    for arm in ARMS:
        paths = {"result": folder / f"{arm}.json", "log": folder / f"{arm}.log"}
        job = {
            "arm": arm,
            "model_type": model_type,
            "dtypes": options.dtypes,
            "backend": options.backend,
            "folder": str(folder),
            "choice": choice,
            "timeout": options.timeout,
            **{key: str(path) for key, path in paths.items()},
        }
        outcome = arm_outcome(servers[arm].run(job), paths["result"], paths["log"])
        result["arms"][arm] = outcome
        if choice is None:
            if outcome["status"] != "ok":
                result.update(status=outcome["status"], reason=failure_reason(outcome))
                break
            choice = outcome["choice"]
    shutil.rmtree(folder, ignore_errors=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def progress_line(result: dict[str, Any], dtypes: list[str]) -> str:
    """A one-line summary of a model's result for the console."""
    if result["status"] != "ok":
        return f"{result['status']}: {result.get('reason', '')[:120]}"
    parts = []
    for dtype in dtypes:
        cells = []
        for arm in ARMS:
            run = result["arms"].get(arm, {}).get("runs", {}).get(dtype, {})
            fullgraph = run.get("fullgraph", {}).get("ok")
            cells.append(f"{run.get('breaks', '?')}{'' if fullgraph else '!'}")
        parts.append(f"{dtype} {'->'.join(cells)}")
    return "breaks " + ", ".join(parts)


def arm_env(cache_dir: str) -> dict[str, str]:
    """The environment both arm servers run in (offline, one thread, private cache)."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "GRAPHMEND_CACHE_DIR": cache_dir,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("GRAPHMEND", None)
    return env


def run_census(
    options: argparse.Namespace, types: list[str], journal: Path
) -> list[dict[str, Any]]:
    """Every model type through both arms, ``options.jobs`` at a time.

    Each finished model is appended to ``journal`` (one JSON line) at once, so
    an interrupted run loses nothing and ``--resume`` carries on from it.
    """
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    slots: queue.Queue[dict[str, ArmServer]] = queue.Queue()
    with tempfile.TemporaryDirectory(prefix="graphmend-census-") as scratch:
        workdir = Path(scratch)
        env = arm_env(str(workdir / "graphmend-cache"))
        all_servers = [
            {
                arm: ArmServer(arm, options, env, workdir / f"server-{slot}-{arm}.log")
                for arm in ARMS
            }
            for slot in range(options.jobs)
        ]
        for servers in all_servers:
            slots.put(servers)

        def one(model_type: str) -> None:
            servers = slots.get()
            try:
                result = census_model(model_type, servers, options, workdir)
            finally:
                slots.put(servers)
            with lock:
                results.append(result)
                with journal.open("a") as lines:
                    lines.write(json.dumps(result) + "\n")
                line = progress_line(result, options.dtypes)
                print(
                    f"[{len(results):>3}/{len(types)}] {model_type}: {line} ({result['seconds']} s)"
                )

        try:
            with ThreadPoolExecutor(options.jobs) as pool:
                for future in [pool.submit(one, model_type) for model_type in types]:
                    future.result()
        finally:
            for servers in all_servers:
                for server in servers.values():
                    server.close()
    return sorted(results, key=lambda result: result["model_type"])


def metadata(options: argparse.Namespace, types: list[str]) -> dict[str, Any]:
    """Versions and settings that the results depend on."""
    import graphmend
    from graphmend.config import ALL_REWRITES, Config

    return {
        **environment(),
        "graphmend": graphmend.__version__,
        "rewrites": sorted(Config.from_env().rewrites),
        "known_rewrites": list(ALL_REWRITES),
        "dtypes": options.dtypes,
        "explain_backend": "eager",
        "fullgraph_backend": options.backend,
        "jobs": options.jobs,
        "timeout_seconds": options.timeout,
        "only": options.only,
        "model_types": len(types),
        "inputs": {"batch": BATCH, "sequence": SEQUENCE, "decoder_sequence": DECODER_SEQUENCE},
        "config_levels": list(LEVELS),
        "max_parameters": MAX_PARAMETERS,
    }


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--dtype`` becomes the list ``dtypes``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", metavar="REGEX", help="model types to run (re.search)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="models at once")
    parser.add_argument(
        "--dtype",
        default="float32,float16",
        help=f"comma-separated, from {', '.join(DTYPES)} (default: float32,float16)",
    )
    parser.add_argument(
        "--backend", default="eager", help="backend of the fullgraph=True compile (default: eager)"
    )
    parser.add_argument(
        "--timeout", type=float, default=120, help="seconds per arm of one model (default: 120)"
    )
    parser.add_argument("--out", type=Path, help="output directory")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the models an interrupted run already finished (from its journal)",
    )
    parser.add_argument("--serve", choices=ARMS, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    options.dtypes = [name.strip() for name in options.dtype.split(",") if name.strip()]
    unknown = sorted(set(options.dtypes) - set(DTYPES))
    if unknown or not options.dtypes:
        parser.error(f"--dtype: unknown {', '.join(unknown) or '(empty)'}; use {', '.join(DTYPES)}")
    if options.jobs < 1:
        parser.error("--jobs must be at least 1")
    return options


def finished_models(journal: Path) -> dict[str, dict[str, Any]]:
    """Results an interrupted run appended to its journal, by model type."""
    if not journal.exists():
        return {}
    finished = {}
    for line in journal.read_text().splitlines():
        try:
            result = json.loads(line)
        except json.JSONDecodeError:  # the line being written when the run was killed
            continue
        finished[result["model_type"]] = result
    return finished


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    if options.serve:
        serve(options.serve, options.backend)
        return 0
    version = importlib.metadata.version("transformers")
    out = options.out or Path(__file__).parent / "results" / f"census-{version}"
    types = model_types(options.only)
    if not types:
        print(f"no model type matches {options.only!r}", file=sys.stderr)
        return 2
    meta = metadata(options, types)
    out.mkdir(parents=True, exist_ok=True)
    journal = out / JOURNAL
    done = finished_models(journal) if options.resume else {}
    if not options.resume:
        journal.unlink(missing_ok=True)
    print(
        f"transformers {version}, torch {torch.__version__}: {len(types)} model types, "
        f"{options.jobs} at a time, dtypes {', '.join(options.dtypes)}; progress lines show "
        "breaks without->with GraphMend, ! where fullgraph=True fails"
    )
    if done:
        print(f"resuming: {len(done)} model types already finished in {journal}")
    started = time.perf_counter()
    fresh = run_census(options, [name for name in types if name not in done], journal)
    meta["wall_seconds"] = round(time.perf_counter() - started, 1)
    meta["resumed"] = len(done)
    models = sorted([*done.values(), *fresh], key=lambda result: result["model_type"])
    census = {"meta": meta, "models": [model for model in models if model["model_type"] in types]}
    (out / "census.json").write_text(json.dumps(census, indent=1) + "\n")
    journal.unlink()
    written = [out / "census.json", *write_report(census, out)]
    print(f"wrote {', '.join(map(str, written))} ({meta['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
