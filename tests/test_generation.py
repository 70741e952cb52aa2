"""Production workflows on real transformers model code: ``generate`` with the forward
compiled, and a training step with dropout, under GraphMend.

The model runs in a child process that installs the hook before transformers is
imported; eager runs there execute the original statements.  XLM's
``assert lengths.max().item() <= slen`` breaks every decode step under plain compile
(one graph more per new token); GraphMend lowers it.  The token ids (sampled
with a fixed seed from left-padded input: an extra random draw or a wrong mask would
show), the loss and every parameter's gradient (dropout on) must be the same bits as
eager's, in fewer graphs.  (Measured against a plain arm too: the same token ids, loss
and gradients on transformers 4.51.3 and 5.24.0.)
"""

from __future__ import annotations

import json

import torch

from helpers.processes import offline_model_environment, run_python

WORKFLOWS = """
import json
import sys

if sys.argv[1] == "graphmend":
    import graphmend

    graphmend.install()
import torch
from torch._dynamo.testing import CompileCounter
from transformers import XLMConfig, XLMWithLMHeadModel


def build():
    torch.manual_seed(0)
    config = XLMConfig(
        vocab_size=99, emb_dim=16, n_layers=2, n_heads=2, max_position_embeddings=64,
        pad_token_id=2, dropout=0.1, attention_dropout=0.1,
    )
    return XLMWithLMHeadModel(config)


def prompt():
    ids = torch.randint(4, 99, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = 2, 0
    return {"input_ids": ids, "attention_mask": mask}


def generate(compile_forward):
    torch._dynamo.reset()
    model = build().eval()
    counter = CompileCounter()
    if compile_forward:
        model.forward = torch.compile(model.forward, backend=counter)
    torch.manual_seed(123)
    ids = model.generate(**prompt(), max_new_tokens=4, min_new_tokens=4, do_sample=True, top_k=20)
    return ids.tolist(), counter.frame_count


def train_step(compile_forward):
    torch._dynamo.reset()
    model = build().train()
    counter = CompileCounter()
    forward = torch.compile(model.forward, backend=counter) if compile_forward else model
    torch.manual_seed(7)
    inputs = prompt()
    loss = forward(**inputs, labels=inputs["input_ids"]).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return [loss, *grads], counter.frame_count


loader = type(sys.modules[XLMWithLMHeadModel.__module__].__loader__).__name__
tokens = {arm: generate(arm == "compiled") for arm in ("eager", "compiled")}
trained = {arm: train_step(arm == "compiled") for arm in ("eager", "compiled")}
torch.save({arm: tensors for arm, (tensors, _) in trained.items()}, sys.argv[2])
print(json.dumps({
    "loader": loader,
    "tokens": {arm: ids for arm, (ids, _) in tokens.items()},
    "graphs": [tokens["compiled"][1], trained["compiled"][1]],
}))
"""


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(torch.int32)


def test_generate_and_training_step_compiled_match_eager_in_few_graphs(tmp_path):
    saved = tmp_path / "tensors.pt"
    env = offline_model_environment(tmp_path)
    child = run_python("-c", WORKFLOWS, "graphmend", str(saved), env=env)
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    assert seen["loader"] == "GraphMendLoader"
    assert seen["tokens"]["compiled"] == seen["tokens"]["eager"]
    trained = torch.load(saved)
    assert len(trained["compiled"]) == len(trained["eager"]) > 1
    for got, want in zip(trained["compiled"], trained["eager"], strict=True):
        assert torch.equal(_bits(got), _bits(want))
    # Plain compile breaks at the assert in every decode step (12 graphs here, torch
    # 2.13, transformers 5.24) and in the training forward (3 graphs).
    generate_graphs, train_graphs = seen["graphs"]
    assert generate_graphs <= 3
    assert train_graphs == 1
