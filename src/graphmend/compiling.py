"""Compiling source as the interpreter does, with the errors it reports."""

from __future__ import annotations

import io
import re
import tokenize
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


#: A comment declaring the encoding of a source file (PEP 263).
_CODING = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+", re.ASCII)


def source_text(source: bytes) -> str:
    """``source`` as text, as ``importlib.util.decode_source`` gives it (its encoding
    honoured, newlines translated), where a byte the encoding cannot decode is replaced:
    the compiler reads comments without decoding them, so a module whose comment holds
    one (a Latin-1 ``é`` under a UTF-8 declaration) imports, and its text is needed for
    its lines alone."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    decoder = io.IncrementalNewlineDecoder(None, translate=True)
    return decoder.decode(source.decode(encoding, errors="replace"), final=True)


def check_script_encoding(source: bytes, filename: str) -> None:
    """Raise the ``SyntaxError`` the interpreter raises for a script (``python path``,
    ``python -``) that declares no encoding and is not UTF-8: its reader checks every
    line, comments included, where ``compile`` of the bytes (an import) skips comments."""
    first_lines = source.split(b"\n", 2)[:2]
    if source.startswith(b"\xef\xbb\xbf") or any(
        _CODING.match(line.decode("latin-1")) for line in first_lines
    ):
        return
    try:
        source.decode("utf-8")
    except UnicodeDecodeError as error:
        line = source.count(b"\n", 0, error.start) + 1
        raise SyntaxError(
            f"Non-UTF-8 code starting with '\\x{source[error.start]:02x}' in file {filename} "
            f"on line {line}, but no encoding declared; see https://peps.python.org/pep-0263/ "
            "for details"
        ) from None
