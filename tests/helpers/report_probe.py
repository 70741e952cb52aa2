"""Child process for the report tests: ``graphmend.report`` on real transformers models.

    python report_probe.py CASE [CASE...]

Installs GraphMend before any model code is imported, builds each case (from
``model_probe.CASES`` or the models below, small configs, random weights) and
prints one JSON object: for each case, its report (``Report.to_json``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import graphmend

graphmend.install()

import torch  # noqa: E402
from model_probe import CASES, _ids, case  # noqa: E402


@case
def led_global_attention():
    from transformers import LEDConfig, LEDModel

    config = LEDConfig(
        vocab_size=99,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_encoder_position_embeddings=64,
        max_decoder_position_embeddings=64,
        attention_window=4,
    )
    ids = _ids(99, (2, 16))
    return LEDModel(config), {"input_ids": ids, "decoder_input_ids": ids[:, :8]}


@case
def encodec_padding():
    from transformers import EncodecConfig, EncodecModel

    config = EncodecConfig(
        num_filters=4, hidden_size=8, num_residual_layers=1, codebook_dim=8, num_lstm_layers=1
    )
    audio = torch.randn(2, 1, 480, generator=torch.Generator().manual_seed(4))
    return EncodecModel(config), {"input_values": audio}


@case
def fastspeech2_conformer_model():
    from transformers import FastSpeech2ConformerConfig, FastSpeech2ConformerModel

    config = FastSpeech2ConformerConfig(
        hidden_size=16,
        vocab_size=40,
        num_mel_bins=8,
        encoder_num_attention_heads=2,
        decoder_num_attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        encoder_linear_units=32,
        decoder_linear_units=32,
        speech_decoder_postnet_layers=1,
        speech_decoder_postnet_units=8,
        duration_predictor_layers=1,
        duration_predictor_channels=8,
        energy_predictor_layers=1,
        energy_predictor_channels=8,
        pitch_predictor_layers=1,
        pitch_predictor_channels=8,
    )
    ids = _ids(40, (2, 12))
    return FastSpeech2ConformerModel(config), {"input_ids": ids}


def report(name: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model, inputs = CASES[name]()
    model.eval()
    with torch.no_grad():
        return graphmend.report(model, **inputs).to_json()


if __name__ == "__main__":
    print(json.dumps({name: report(name) for name in sys.argv[1:]}))
