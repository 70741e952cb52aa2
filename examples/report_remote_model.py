"""Compile a trust_remote_code model of bench/remote_corpus/ and call it once.

    python -m graphmend report --compare examples/report_remote_model.py bench/remote_corpus/chatglm3

Fetch the published model files first (``python bench/remote_corpus_fetch.py``:
they are not part of this repository).  Loads them offline (transformers copies them into
its dynamic-module cache), with the corpus's tiny config and random weights, and
calls it on a padded batch, as a serving stack would with fullgraph=True.
"""

import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

folder = sys.argv[1] if len(sys.argv) > 1 else "bench/remote_corpus/chatglm3"
config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
model = AutoModelForCausalLM.from_config(config, trust_remote_code=True).eval()
input_ids = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(0))
attention_mask = torch.ones(2, 8, dtype=torch.long)
attention_mask[1, :3] = 0  # a left-padded row
compiled = torch.compile(model, fullgraph=True)
with torch.no_grad():
    logits = compiled(input_ids=input_ids, attention_mask=attention_mask).logits
print("logits", tuple(logits.shape))
