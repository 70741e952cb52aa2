"""Names GraphMend injects stay out of sight: ``dir(module)`` and ``from module import *``
see what they see without GraphMend, and TorchDynamo still traces the rewritten code."""

from __future__ import annotations

import importlib
import pickle

import torch

from graphmend.rewrites.common import PREFIX
from helpers.graphs import compile_and_run
from helpers.modules import EVERY_REWRITE

MODULE = EVERY_REWRITE


def _star_import(name: str) -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    del namespace["__builtins__"]
    return namespace


def test_dir_and_star_import_show_no_injected_name(write_module, load_rewritten):
    plain = importlib.import_module(write_module(MODULE))
    rewritten = load_rewritten(MODULE)
    assert any(name.startswith(PREFIX) for name in vars(rewritten))  # it was rewritten
    assert dir(rewritten) == dir(plain)
    assert _star_import(rewritten.__name__).keys() == _star_import(plain.__name__).keys()
    # Functions still pickle by reference to the module.
    assert pickle.loads(pickle.dumps(rewritten.step)) is rewritten.step


def test_a_global_named_like_the_injected_dir_is_listed(write_module, load_rewritten):
    """Only the injected ``__dir__`` itself is hidden: ``__dir__cache``, a name of the
    module, was hidden with it."""
    source = MODULE + "\n__dir__cache = {}\n"
    plain = importlib.import_module(write_module(source))
    rewritten = load_rewritten(source)
    assert "__dir__cache" in dir(rewritten)
    assert dir(rewritten) == dir(plain)


def test_the_module_own_dir_is_kept(load_rewritten):
    module = load_rewritten(MODULE + "\ndef __dir__():\n    return ['step']\n")
    assert dir(module) == ["step"]


def test_the_rewritten_module_still_compiles_to_one_graph(load_rewritten, capsys):
    module = load_rewritten(MODULE)
    x = torch.tensor([1.0, -3.0])
    compiled = compile_and_run(module.step, x, fullgraph=True)
    assert (compiled.graphs, compiled.breaks) == (1, 0)
    assert torch.equal(compiled.result, module.step(x))
    assert capsys.readouterr().out == "step torch.Size([2])\n" * 2
