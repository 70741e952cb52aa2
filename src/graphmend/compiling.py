"""Compiling source as the interpreter does, with the errors it reports."""

from __future__ import annotations

from typing import Any


def compile_source(source: bytes | str, filename: str, flags: int = 0) -> Any:
    """``compile(source, filename, "exec", flags)``, where a null byte in ``source`` is a
    ``SyntaxError`` at its file and line, as the interpreter reports it for a script
    (``compile`` names neither, and older Pythons raise ``ValueError``)."""
    try:
        return compile(source, filename, "exec", flags, dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        if getattr(error, "filename", None) is not None:
            raise
        text = source.decode(errors="replace") if isinstance(source, bytes) else source
        null = text.find("\0")
        if null < 0:
            raise
        start = text.rfind("\n", 0, null) + 1
        where = (filename, text.count("\n", 0, null) + 1, None, text[start:null])
        raise SyntaxError("source code cannot contain null bytes", where) from None
