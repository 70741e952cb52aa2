"""On-disk cache of rewritten bytecode, keyed by content.

The key covers everything the code depends on: the source bytes, the file's
path (it is baked into the code object), GraphMend's own code, the rewrite
settings, the builtins the rewrites rely on, the optimisation level and the
interpreter's bytecode magic.  Keying
on content rather than mtime means a fresh checkout or a restored image hits
the cache.  An entry is written to a temporary file in the same directory and
renamed into place, so concurrent processes (every rank of a ``torchrun`` job)
never read a torn entry; a short, corrupt or mismatched entry is ignored and
rebuilt; a directory that cannot be written is used read-only.  One entry is kept
per file, settings, interpreter and GraphMend release (its slot, the first bytes of
the key): storing the entry of a new version of a file removes those of earlier
ones, while two releases that import one file (``trust_remote_code`` modules live in
Hugging Face's cache, which every environment shares) keep an entry each, as
pytest's ``.pyc`` files carry its version.

Entries are code that the process runs, and their key is computed from public
inputs, so whoever can write the cache can run code in every process that reads
it.  Only directories and entries owned by this user or by root and writable by
no one else are used (each checked when opened: an entry's owner and mode are
read from the open file; a directory is not reached through another user's
symbolic link); anything else means no cache, with one
:class:`~graphmend.GraphMendWarning` per directory.  The import hook creates its
directories (missing parents too) 0700; ``cache warm`` creates them 0755, for a
cache that one user fills and others read.  An entry gets the read bits of its source file, as
CPython gives a ``.pyc`` (it reveals nothing its source does not), and only its
owner may write it.  What lies above the cache directory is the user's business,
as for pip's cache or CPython's ``__pycache__``.

This is GraphMend's own cache, like TorchInductor's: ``PYTHONDONTWRITEBYTECODE``
does not switch it off; ``GRAPHMEND_CACHE=0`` does.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import re
import stat
import struct
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from types import CodeType
from typing import Any

from graphmend import interpreter_builtins
from graphmend.notices import warn

_MAGIC = b"GMC1"
_HEADER = struct.Struct("<4s32s16sI")  # magic, key digest, payload checksum, metadata length
SUFFIX = ".gmc"
#: The bytes of a key that name its slot: one entry per file, settings, interpreter and
#: GraphMend release.
_SLOT_BYTES = 8

#: The mode of the directories the import hook creates: this user's alone.
PRIVATE = 0o700
#: The mode of the directories ``cache warm`` creates: others may read, never write.
SHARED = 0o755

# Ownership and modes mean nothing on Windows, whose ACLs are the user profile's business.
_CHECKS_OWNERS = hasattr(os, "geteuid")
#: Not following a link, and not waiting: opening a named pipe to read waits for a writer
#: (a regular file reads the same with O_NONBLOCK).
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_BINARY", 0)
)
_warned: set[str] = set()
_RULE = (
    "Cached code runs in every process that reads it, so only directories and entries "
    "owned by this user or root and writable by no one else are trusted"
)


@dataclass(frozen=True)
class CacheEntry:
    """Code read back from the cache, with what was stored beside it: the summary, and
    whether compiling the original source issues warnings."""

    code: CodeType
    summary: dict[str, dict[str, int]]
    warns: bool = False


@dataclass(frozen=True)
class CacheInfo:
    """What ``cache info`` reports."""

    directory: Path
    entries: int
    size_bytes: int
    distrusted: tuple[str, ...] = ()


class Access(str, Enum):
    """What this process may do with a cache directory."""

    READ_WRITE = "read-write"
    READ_ONLY = "read-only"
    UNUSABLE = "unusable"


@dataclass(frozen=True)
class CacheCheck:
    """The answer of :meth:`BytecodeCache.check`: the access and, when not read-write, why."""

    access: Access
    reason: str = ""


@cache
def graphmend_fingerprint() -> str:
    """A digest of GraphMend's own source: a change to any rewrite invalidates entries.

    Read once, at the first claimed import.  Only the files Python can import as
    GraphMend's modules count: an editor's files beside them (Emacs's lock file
    ``.#cache.py``, a dangling symbolic link while the file is being edited) are none of
    its code.  OSError when a module cannot be read.
    """
    return _fingerprint_now()


@cache
def fingerprint_still_holds() -> bool:
    """Whether GraphMend's source still has :func:`graphmend_fingerprint`, asked once the
    rewrites are loaded, before the first entry is stored.

    A process loads the rewrites at its first cache miss, which may come long after its
    first claimed import: where GraphMend's files changed in between (an upgrade under a
    running server), the code they rewrite is not what the key says, and is not stored
    (a process of the release the key names would load it)."""
    try:
        return _fingerprint_now() == graphmend_fingerprint()
    except OSError:
        return False


def _fingerprint_now() -> str:
    import graphmend

    package = Path(graphmend.__file__).parent
    digest = hashlib.sha256(graphmend.__version__.encode())
    modules = (path for path in package.rglob("*.py") if _importable(path, package))
    for path in sorted(modules):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _importable(path: Path, package: Path) -> bool:
    """Whether ``path`` (below ``package``) names a module Python could import."""
    return all(part.isidentifier() for part in path.relative_to(package).with_suffix("").parts)


def _digest(*parts: bytes) -> bytes:
    """A SHA-256 digest of ``parts``, each prefixed by its length."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.digest()


#: The longest module name (in bytes) an entry's file name holds as it is: the slot's
#: digest, the key, the suffix and a temporary file's affixes add about 70 characters,
#: and a file name holds 255 bytes.
_NAME_BYTES = 150


def _slot_prefix(module_name: str, key: bytes) -> str:
    """What the names of a slot's entries start with: the module and the slot's digest."""
    return f"{_file_name_part(module_name)}.{key[:_SLOT_BYTES].hex()}-"


def _file_name_part(module_name: str) -> str:
    """The module's name as its entries' file names hold it: as it is where it is made of
    ASCII identifiers and fits; else its last part (an ASCII identifier, its first 40 characters)
    and ``~`` with a digest of the whole.  A name that is not ASCII may not be encodable
    in the file system's encoding (``LC_ALL=C``).  Any string names a module
    (``spec_from_file_location``): a NUL, a ``/`` or a glob's ``*`` must not reach the
    file system, and a ``transformers_modules`` name with a commit in it may be longer
    than a file name can be."""
    encoded = module_name.encode("utf-8", "surrogatepass")
    if (
        len(encoded) <= _NAME_BYTES
        and module_name.isascii()  # any file system encoding can name it
        and all(part.isidentifier() for part in module_name.split("."))
    ):
        return module_name
    last = module_name.rsplit(".", 1)[-1]
    readable = last[:40] if last.isidentifier() and last.isascii() else ""
    return f"{readable}~{hashlib.blake2b(encoded, digest_size=10).hexdigest()}"


def _checksum(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


class BytecodeCache:
    """A directory of rewritten code objects, one file per (module, key)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._tag_dir = self.directory / (sys.implementation.cache_tag or "python")

    @staticmethod
    def key(source: bytes, filename: str, settings: str) -> bytes:
        """The 32-byte digest an entry is stored and checked under: the digest of its
        slot (:func:`_digest` of what stays the same from one version of the file to the
        next, :data:`_SLOT_BYTES` bytes), then that of everything else."""
        import graphmend

        slot = _digest(
            graphmend.__version__.encode(),
            importlib.util.MAGIC_NUMBER,
            settings.encode(),
            interpreter_builtins.fingerprint().encode(),
            str(sys.flags.optimize).encode(),
            os.fsencode(filename),
        )
        content = _digest(slot, graphmend_fingerprint().encode(), source)
        return slot[:_SLOT_BYTES] + content[: len(content) - _SLOT_BYTES]

    def path_for(self, module_name: str, key: bytes) -> Path:
        """The entry file of a module's code under ``key``."""
        return (
            self._tag_dir
            / f"{_slot_prefix(module_name, key)}{key[_SLOT_BYTES:].hex()[:32]}{SUFFIX}"
        )

    def load(self, module_name: str, key: bytes) -> CacheEntry | None:
        """The entry for ``key``, or ``None`` when missing, unreadable or not trustworthy."""
        if not self._usable():
            return None
        data = _read_entry(self.path_for(module_name, key))
        if data is None or len(data) < _HEADER.size:
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
        if not isinstance(code, CodeType) or not _valid_meta(meta):
            return None
        return CacheEntry(code, meta["summary"], meta["warns"])

    def store(
        self,
        module_name: str,
        key: bytes,
        code: CodeType,
        summary: dict[str, dict[str, int]],
        *,
        warns: bool = False,
    ) -> bool:
        """Write an entry atomically; False when the directory cannot be written or
        ``marshal`` refuses the code.

        The entry gets the read bits of the file ``code`` was compiled from.
        """
        meta = json.dumps({"summary": summary, "warns": warns}).encode()
        try:
            payload = meta + marshal.dumps(code)
        except ValueError:  # code nested too deeply to marshal: nothing is stored
            return False
        header = _HEADER.pack(_MAGIC, key, _checksum(payload), len(meta))
        target = self.path_for(module_name, key)
        if not self.create_directories(PRIVATE):
            return False
        temporary: Path | None = None
        try:
            with tempfile.NamedTemporaryFile(
                dir=target.parent, prefix=f".{target.name}.", suffix=".tmp", delete=False
            ) as handle:
                temporary = Path(handle.name)
                os.chmod(temporary, _entry_mode(code.co_filename))
                handle.write(header + payload)
            os.replace(temporary, target)
        except OSError:
            if temporary is not None:
                _remove_quietly(temporary)
            return False
        self._evict_earlier(module_name, key)
        return True

    def _evict_earlier(self, module_name: str, key: bytes) -> None:
        """Remove the entries of earlier versions of the file (or of GraphMend) that the
        entry under ``key`` replaces: those of the same slot, under another key.  An
        entry is kept per file, settings, interpreter and release, as CPython keeps one
        ``.pyc`` per source file and optimisation level."""
        current = self.path_for(module_name, key)
        for path in self._tag_dir.glob(f"{_slot_prefix(module_name, key)}*{SUFFIX}"):
            if path != current:
                _remove_quietly(path)

    def create_directories(self, mode: int, problems: list[str] | None = None) -> bool:
        """Create the missing cache directories with ``mode``; whether all are usable.
        Why not goes to ``problems`` where given, else into a warning (once)."""
        for directory in (self.directory, self._tag_dir):
            try:
                _make_directory(directory, mode)
            except OSError as error:
                problem = f"{directory} cannot be created ({error.strerror or error})"
                if problems is None:
                    _warn_once(directory, problem)
                else:
                    problems.append(problem)
                return False
            if not self._trusted(directory, problems):
                return False
        return True

    def check(self) -> CacheCheck:
        """Whether this process can read and write the cache; creates nothing, warns nothing."""
        for directory in (self.directory, self._tag_dir):
            try:
                problem = _directory_problem(directory)
            except FileNotFoundError:
                return _creatable(directory)
            if problem is not None:
                return CacheCheck(Access.UNUSABLE, problem)
        if not os.access(self._tag_dir, os.X_OK):
            return CacheCheck(Access.UNUSABLE, f"{self._tag_dir} cannot be entered by this user")
        if not os.access(self._tag_dir, os.W_OK):
            return CacheCheck(
                Access.READ_ONLY,
                f"{self._tag_dir} is not writable by this user: entries are read, none written",
            )
        return CacheCheck(Access.READ_WRITE)

    def _usable(self) -> bool:
        return all(self._trusted(directory) for directory in (self.directory, self._tag_dir))

    @staticmethod
    def _trusted(directory: Path, distrusted: list[str] | None = None) -> bool:
        """Whether ``directory`` exists and may be used; when it may not, why goes to
        ``distrusted`` where given, else into a warning (once)."""
        try:
            problem = _directory_problem(directory)
        except FileNotFoundError:
            return False
        if problem is not None and distrusted is not None:
            distrusted.append(problem)
        elif problem is not None:
            _warn_once(directory, problem)
        return problem is None

    def _tag_directories(self, distrusted: list[str] | None = None) -> Iterator[Path]:
        """The trusted directory of every interpreter that stored entries here; OSError
        when the cache directory cannot be listed.  ``distrusted``: as for :meth:`_trusted`."""
        if not self._trusted(self.directory, distrusted):
            return
        tag_dirs = sorted(
            child
            for child in _listing(self.directory)
            if _TAG.fullmatch(child.name) and child.is_dir() and not child.is_symlink()
        )
        yield from (tag_dir for tag_dir in tag_dirs if self._trusted(tag_dir, distrusted))

    def info(self) -> CacheInfo:
        """Where the cache is, how many entries it holds and their total size (in the
        directories it trusts: ``distrusted`` says why others are not counted); OSError
        when a directory of it cannot be listed."""
        distrusted: list[str] = []
        sizes = [
            path.stat().st_size
            for tag_dir in self._tag_directories(distrusted)
            for path in _listing(tag_dir, SUFFIX)
            if path.is_file()
        ]
        return CacheInfo(self.directory, len(sizes), sum(sizes), tuple(distrusted))

    def clear(self) -> Cleared:
        """Delete every entry (and leftover temporary files); what was removed, and why
        anything was not."""
        removed, problems, distrusted = 0, [], []
        try:
            for tag_dir in self._tag_directories(distrusted):
                for path in _listing(tag_dir, SUFFIX):
                    problem = _foreign_file(path) or _removal_problem(path)
                    if problem is None:
                        removed += 1
                    else:
                        problems.append(problem)
                for leftover in _listing(tag_dir, ".tmp"):
                    if _TEMPORARY.fullmatch(leftover.name) and _foreign_file(leftover) is None:
                        _remove_quietly(leftover)
        except OSError as error:
            problems.append(f"{error.filename} cannot be listed ({error.strerror or error})")
        problems += [f"{problem}; nothing in it was removed" for problem in distrusted]
        return Cleared(removed, tuple(problems))


@dataclass(frozen=True)
class Cleared:
    """What ``cache clear`` did: the entries removed, and why others were not."""

    removed: int
    problems: tuple[str, ...] = ()


def _listing(directory: Path, suffix: str = "") -> list[Path]:
    """The names in ``directory`` ending with ``suffix``; OSError when it cannot be listed
    (``Path.glob`` would say nothing)."""
    with os.scandir(directory) as children:
        return [Path(child.path) for child in children if child.name.endswith(suffix)]


#: The names of the directories entries are stored in: an interpreter's cache tag
#: (``cpython-311``, ``pypy310``, ``graalpy240-310``), or ``python`` where it has none.
_TAG = re.compile(r"[a-z]+(?:[0-9]+(?:-[0-9]+)?|-[0-9]+)|python")
#: The name of an entry, and of the temporary file it was written to first.
_ENTRY = re.compile(rf"[^/]+\.[0-9a-f]{{{2 * _SLOT_BYTES}}}-[0-9a-f]{{32}}{re.escape(SUFFIX)}")
_TEMPORARY = re.compile(rf"\.{_ENTRY.pattern}\.[a-z0-9_]{{8}}\.tmp")


def _foreign_file(path: Path) -> str | None:
    """Why ``path``, named as an entry or its temporary file, must be left as it is, or
    ``None``: it is not named as GraphMend names them, or does not start as GraphMend
    writes them (a file emptied by a crash, or a temporary file written no further than
    its creation, is one of GraphMend's).  A ``GRAPHMEND_CACHE_DIR`` naming a directory
    of the user's own must not cost the user a file."""
    foreign = f"{path} is not an entry of GraphMend's cache; it was left as it is"
    if not (_ENTRY.fullmatch(path.name) or _TEMPORARY.fullmatch(path.name)):
        return foreign
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"{path} cannot be read ({error.strerror or error}); it was left as it is"
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # a directory opens, but not as a file
        os.close(descriptor)
        return foreign
    with os.fdopen(descriptor, "rb") as handle:
        if handle.read(len(_MAGIC)) in (_MAGIC, b""):
            return None
    return foreign


def _removal_problem(path: Path) -> str | None:
    """Remove ``path``; why it could not be, or ``None`` (also when already gone)."""
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        return f"{path} cannot be removed ({error.strerror or error})"
    return None


def _distrust(path: Path, status: os.stat_result) -> str | None:
    """Why a directory or entry with this status must not be used, or ``None``."""
    if not _CHECKS_OWNERS:
        return None
    reasons = []
    if status.st_uid not in (0, os.geteuid()):
        reasons.append(f"it belongs to another user, not to this one (uid {os.geteuid()}) or root")
    writers = [
        who
        for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH))
        if status.st_mode & bit
    ]
    if writers:
        reasons.append(f"{' and '.join(writers)} can write it")
    if not reasons:
        return None
    mode = stat.S_IMODE(status.st_mode)
    return f"{path} (owner uid {status.st_uid}, mode {mode:04o}): {'; '.join(reasons)}. {_RULE}"


def _foreign_link(path: Path, status: os.stat_result) -> str | None:
    """Why a directory reached through this link (``lstat``) must not be used, or ``None``:
    another user's link chooses where entries are written and read."""
    if not _CHECKS_OWNERS or not stat.S_ISLNK(status.st_mode):
        return None
    if status.st_uid in (0, os.geteuid()):
        return None
    return (
        f"{path} (owner uid {status.st_uid}) is a symbolic link of another user, not of "
        f"this one (uid {os.geteuid()}) or root. {_RULE}"
    )


def _directory_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot hold entries, or ``None``; FileNotFoundError when missing."""
    try:
        link = os.lstat(directory)
        status = os.stat(directory)
    except FileNotFoundError:
        raise
    except OSError as error:
        return f"{directory} cannot be read ({error.strerror or error})"
    if not stat.S_ISDIR(status.st_mode):
        return f"{directory} is not a directory"
    return _foreign_link(directory, link) or _distrust(directory, status)


def _creatable(missing: Path) -> CacheCheck:
    ancestor = missing.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.is_dir() and os.access(ancestor, os.W_OK | os.X_OK):
        return CacheCheck(Access.READ_WRITE)
    return CacheCheck(
        Access.UNUSABLE, f"{missing} does not exist and cannot be created in {ancestor}"
    )


def _make_directory(directory: Path, mode: int) -> None:
    """Create ``directory`` and its missing parents with exactly ``mode``, whatever the umask.

    ``os.makedirs`` would make the parents 0777 less the umask: a new ``~/.cache``
    that everyone can write under umask 0, or one that the server's user cannot
    enter when ``cache warm`` runs under umask 077.
    """
    if not directory.parent.exists():
        _make_directory(directory.parent, mode)
    try:
        os.mkdir(directory, mode)
    except FileExistsError:
        return
    os.chmod(directory, mode)


def _valid_meta(meta: Any) -> bool:
    """Whether ``meta`` is what :meth:`BytecodeCache.store` writes: a summary (counts of
    decisions per rewrite) and whether compiling the source warns."""
    if not isinstance(meta, dict) or not isinstance(meta.get("warns"), bool):
        return False
    summary = meta.get("summary")
    return isinstance(summary, dict) and all(
        isinstance(counts, dict)
        and all(
            isinstance(decision, str) and type(number) is int for decision, number in counts.items()
        )
        for counts in summary.values()
    )


def _read_entry(path: Path) -> bytes | None:
    """The bytes of an entry file, or ``None`` when missing, unreadable or untrusted.

    The owner and mode are read from the opened file, so nothing can be swapped
    in between the check and the read; a symbolic link is not followed.
    """
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode):  # a directory opens too, but cannot be read
        os.close(descriptor)
        return None
    with os.fdopen(descriptor, "rb") as handle:
        problem = _distrust(path, status)
        if problem is not None:
            _warn_once(path.parent, problem)
            return None
        try:
            return handle.read()
        except OSError:
            return None


def _entry_mode(source: str) -> int:
    """The read bits of the source file (as CPython's ``_calc_mode``), writable by the owner."""
    try:
        source_mode = os.stat(source).st_mode
    except OSError:
        source_mode = stat.S_IRUSR
    return (stat.S_IMODE(source_mode) & 0o444) | stat.S_IWUSR


def _warn_once(directory: Path, problem: str) -> None:
    """One warning per directory and process: the cache there is not used, and why."""
    if str(directory) in _warned:
        return
    _warned.add(str(directory))
    warn(
        f"graphmend does not use its cache in {directory}: {problem}. Modules are "
        "rewritten without the cache; fix the owner or mode, or set GRAPHMEND_CACHE_DIR "
        "to a directory of your own."
    )


def _remove_quietly(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True
