"""On-disk cache of rewritten bytecode, keyed by content.

The key covers everything the code depends on: the source bytes, the file's
path (it is baked into the code object), GraphMend's own code, the rewrite
settings, the optimisation level and the interpreter's bytecode magic.  Keying
on content rather than mtime means a fresh checkout or a restored image hits
the cache.  An entry is written to a temporary file in the same directory and
renamed into place, so concurrent processes (every rank of a ``torchrun`` job)
never read a torn entry; a short, corrupt or mismatched entry is ignored and
rebuilt; a directory that cannot be written is used read-only.

This is GraphMend's own cache, like TorchInductor's: ``PYTHONDONTWRITEBYTECODE``
does not switch it off; ``GRAPHMEND_CACHE=0`` does.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import struct
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import CodeType

_MAGIC = b"GMC1"
_HEADER = struct.Struct("<4s32s16sI")  # magic, key digest, payload checksum, metadata length
SUFFIX = ".gmc"


@dataclass(frozen=True)
class CacheEntry:
    """Code read back from the cache, with the summary stored beside it."""

    code: CodeType
    summary: dict[str, dict[str, int]]


@dataclass(frozen=True)
class CacheInfo:
    """What ``cache info`` reports."""

    directory: Path
    entries: int
    size_bytes: int


@cache
def graphmend_fingerprint() -> str:
    """A digest of GraphMend's own source: a change to any rewrite invalidates entries."""
    import graphmend

    package = Path(graphmend.__file__).parent
    digest = hashlib.sha256(graphmend.__version__.encode())
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _checksum(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


class BytecodeCache:
    """A directory of rewritten code objects, one file per (module, key)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._tag_dir = self.directory / (sys.implementation.cache_tag or "python")

    @staticmethod
    def key(source: bytes, filename: str, settings: str) -> bytes:
        """The 32-byte digest an entry is stored and checked under."""
        digest = hashlib.sha256()
        for part in (
            importlib.util.MAGIC_NUMBER,
            graphmend_fingerprint().encode(),
            settings.encode(),
            str(sys.flags.optimize).encode(),
            os.fsencode(filename),
            source,
        ):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return digest.digest()

    def path_for(self, module_name: str, key: bytes) -> Path:
        """The entry file of a module's code under ``key``."""
        return self._tag_dir / f"{module_name}.{key.hex()[:32]}{SUFFIX}"

    def load(self, module_name: str, key: bytes) -> CacheEntry | None:
        """The entry for ``key``, or ``None`` when missing, unreadable or not trustworthy."""
        try:
            data = self.path_for(module_name, key).read_bytes()
        except OSError:
            return None
        if len(data) < _HEADER.size:
            return None
        magic, stored_key, checksum, meta_length = _HEADER.unpack_from(data)
        payload = data[_HEADER.size :]
        if (
            magic != _MAGIC
            or stored_key != key
            or meta_length > len(payload)
            or _checksum(payload) != checksum
        ):
            return None
        try:
            meta = json.loads(payload[:meta_length])
            code = marshal.loads(payload[meta_length:])
        except (ValueError, EOFError, TypeError):
            return None
        if not isinstance(code, CodeType) or not isinstance(meta, dict):
            return None
        return CacheEntry(code, meta.get("summary", {}))

    def store(
        self,
        module_name: str,
        key: bytes,
        code: CodeType,
        summary: dict[str, dict[str, int]],
    ) -> bool:
        """Write an entry atomically; False when the directory cannot be written."""
        meta = json.dumps({"summary": summary}).encode()
        payload = meta + marshal.dumps(code)
        header = _HEADER.pack(_MAGIC, key, _checksum(payload), len(meta))
        target = self.path_for(module_name, key)
        temporary: Path | None = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                dir=target.parent, prefix=f".{target.name}.", suffix=".tmp", delete=False
            ) as handle:
                temporary = Path(handle.name)
                handle.write(header + payload)
            os.replace(temporary, target)
        except OSError:
            if temporary is not None:
                _remove_quietly(temporary)
            return False
        return True

    def _files(self) -> Iterator[Path]:
        if self.directory.is_dir():
            yield from (path for path in self.directory.rglob(f"*{SUFFIX}") if path.is_file())

    def info(self) -> CacheInfo:
        """Where the cache is, how many entries it holds and their total size."""
        sizes = [path.stat().st_size for path in self._files()]
        return CacheInfo(self.directory, len(sizes), sum(sizes))

    def clear(self) -> int:
        """Delete every entry (and leftover temporary files); returns how many entries."""
        removed = 0
        for path in list(self._files()):
            removed += _remove_quietly(path)
        if self.directory.is_dir():
            for leftover in self.directory.rglob(f".*{SUFFIX}.*.tmp"):
                _remove_quietly(leftover)
        return removed


def _remove_quietly(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True
