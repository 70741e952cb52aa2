"""Compiling source as the interpreter does, with the errors it reports."""

from __future__ import annotations

import ast
import io
import re
import sys
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


def parse_source(source: bytes | str, filename: str) -> ast.Module:
    """The syntax tree of ``source``, as :func:`compile_source` makes it; raises what
    the interpreter's parser raises."""
    tree = compile_source(source, filename, ast.PyCF_ONLY_AST)
    assert isinstance(tree, ast.Module)
    return tree


def parse_tree(source: bytes | str, filename: str) -> ast.Module:
    """:func:`parse_source`, where a source nested too deeply for the parser
    (``RecursionError``, ``MemoryError``), which the interpreter cannot compile either,
    is a ``SyntaxError`` as any other source it refuses (for reports of files)."""
    try:
        return parse_source(source, filename)
    except (RecursionError, MemoryError) as error:
        reason = f"too deeply nested to parse ({type(error).__name__}: {error})"
        raise SyntaxError(reason, (filename, None, None, None)) from None


#: A comment declaring the encoding of a source file (PEP 263), and a line that may come
#: before it (blank, or a comment).
CODING_COMMENT = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")
_BLANK = re.compile(rb"^[ \t\f]*(?:#|$)")
_NEWLINE = re.compile(rb"\r\n|\r|\n")


def source_text(source: bytes) -> str:
    """``source`` as text, as ``importlib.util.decode_source`` gives it (its encoding
    honoured, newlines translated), where a byte the encoding cannot decode is replaced:
    the compiler reads comments without decoding them, so a module whose comment holds
    one (a Latin-1 ``é``) imports, and its text is needed for its lines alone."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except SyntaxError:  # such a byte in the first two lines, with no declaration
        encoding = "utf-8"
    decoder = io.IncrementalNewlineDecoder(None, translate=True)
    return decoder.decode(source.decode(encoding, errors="replace"), final=True)


def check_script_encoding(source: bytes, filename: str) -> None:
    """Raise the ``SyntaxError`` the interpreter raises for a script (``python path``,
    ``python -``) that declares no encoding and is not UTF-8: its reader checks every
    line, comments included, where ``compile`` of the bytes (an import) skips comments."""
    first, second = [*_NEWLINE.split(source, 2)[:2], b""][:2]
    declared = CODING_COMMENT.match(first) or (_BLANK.match(first) and CODING_COMMENT.match(second))
    if source.startswith(b"\xef\xbb\xbf") or declared:
        return
    try:
        source.decode("utf-8")
    except UnicodeDecodeError as error:
        line = len(_NEWLINE.findall(source, 0, error.start)) + 1
        pep = "https://peps.python.org/pep-0263/"
        if sys.version_info < (3, 11):  # its reader had read the next line already
            line, pep = line + 1, "https://python.org/dev/peps/pep-0263/"
        raise SyntaxError(
            f"Non-UTF-8 code starting with '\\x{source[error.start]:02x}' in file {filename} "
            f"on line {line}, but no encoding declared; see {pep} for details"
        ) from None
