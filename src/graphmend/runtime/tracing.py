"""The check at every rewritten site: is TorchDynamo tracing this code, or torch.export?

``torch.compiler.is_compiling()`` says so on torch releases before
``torch.compiler.is_exporting()`` existed.  From then on it is true whenever *some*
thread compiles (torch 2.13 holds it for a whole compile session): code another thread
ran eagerly meanwhile took the tracing path, and where that thread was inside a
compiled call (a frame TorchDynamo fell back on), GraphMend's runtime calls were
compiled as frames of their own (more graphs than plain ``torch.compile``).  There the
check is ``is_dynamo_compiling()`` (folded to a constant by TorchDynamo, False in
Python) or ``is_exporting()`` (non-strict export runs the code in Python).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from graphmend.post_import import when_imported
from graphmend.runtime.deferral import never_compiled


def _traced_or_exported() -> bool:
    return torch.compiler.is_dynamo_compiling() or torch.compiler.is_exporting()


def _never_a_frame(_dynamo: object = None) -> None:
    # Called from a frame TorchDynamo runs in Python, the check would be compiled as a
    # frame of its own, where is_dynamo_compiling() is True.
    never_compiled(_traced_or_exported)


#: True while TorchDynamo traces the caller or torch.export runs it, False when the
#: code runs eagerly.
tracing: Callable[[], bool] = (
    _traced_or_exported if hasattr(torch.compiler, "is_exporting") else torch.compiler.is_compiling
)

when_imported("torch._dynamo", _never_a_frame)
