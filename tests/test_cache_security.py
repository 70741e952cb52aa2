"""The cache against another local user: planted entries never run; a root-warmed cache serves.

Each test runs the attacker (or the server) as uid 65534 through ``setpriv`` and
the victim (or the image build) as root, so they run only as root.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import graphmend
from helpers.processes import python_path, run_python

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
AS_NOBODY = [str(SETPRIV), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _others_can_enter(path: Path) -> bool:
    """Whether another user can reach ``path``: every directory above it searchable."""
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in path.resolve().parents)


def _others_can_run_python() -> bool:
    """Whether another user can start this interpreter (one built in ``/root``, as pyenv
    builds it, loads its ``libpython`` from there)."""
    run = subprocess.run([*AS_NOBODY, sys.executable, "-c", ""], capture_output=True)
    return run.returncode == 0


AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0 and SETPRIV is not None

pytestmark = [
    pytest.mark.skipif(not AS_ROOT, reason="needs root and setpriv to act as another user"),
    pytest.mark.skipif(
        not _others_can_enter(Path(graphmend.__file__)),
        reason="the checkout is in a directory other users cannot enter (mktemp -d makes "
        "it 0700), so the other user cannot import GraphMend",
    ),
]

VICTIM = "VALUE = 42\n\ndef f(x):\n    print('x is', x)\n    return x\n"

# Plants an entry holding hostile code under the key the victim will compute:
# stored in the attacker's own cache, then copied into the target directory.
ATTACK = textwrap.dedent(
    """
    import os, shutil, sys
    from pathlib import Path
    from graphmend.cache import BytecodeCache
    from graphmend.config import Config

    target, source_path, mode = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3], 8)
    key = BytecodeCache.key(Path(source_path).read_bytes(), source_path, Config().settings_key())
    hostile = compile("print('PWNED')\\nVALUE = 42\\n", source_path, "exec")
    own = BytecodeCache(Path(sys.argv[4]))
    assert own.store("gm_victim", key, hostile, {})
    planted = BytecodeCache(target).path_for("gm_victim", key)
    planted.parent.mkdir(parents=True, exist_ok=True)
    for directory in (target, planted.parent):
        if directory.stat().st_uid == os.getuid():
            os.chmod(directory, mode)
    shutil.copy(own.path_for("gm_victim", key), planted)
    os.chmod(planted, 0o644)
    """
)

IMPORT_BOTH = "import gm_victim, gm_other; print('value', gm_victim.VALUE)"


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory like ``/tmp`` (anyone may add to it), holding the claimed modules in ``src``."""
    root = Path(tempfile.mkdtemp(prefix="gm-security-"))
    root.chmod(0o1777)
    source = root / "src"
    source.mkdir(mode=0o755)
    for name in ("gm_victim", "gm_other"):
        (source / f"{name}.py").write_text(VICTIM)
        (source / f"{name}.py").chmod(0o644)
    (root / "attack.py").write_text(ATTACK)
    (root / "attacker-home").mkdir()
    shutil.chown(root / "attacker-home", NOBODY, NOBODY)
    yield root
    shutil.rmtree(root)


#: For the tests that run Python as the other user.
runs_as_nobody = pytest.mark.skipif(
    AS_ROOT and not _others_can_run_python(),
    reason=f"another user cannot run this interpreter ({sys.executable})",
)


def _as_nobody(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AS_NOBODY, sys.executable, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _hook_env(shared: Path, cache: Path) -> dict[str, str]:
    return {
        "GRAPHMEND": "1",
        "GRAPHMEND_PACKAGES": "gm_victim,gm_other",
        "GRAPHMEND_CACHE_DIR": str(cache),
        "GRAPHMEND_LOG": "debug",
        "PYTHONPATH": python_path(shared / "src"),
    }


@pytest.mark.parametrize(
    ("precreated", "attacker_mode", "then", "blamed"),
    [
        (None, 0o777, None, "owner uid 65534, mode 0777"),
        (None, 0o755, None, "owner uid 65534, mode 0755"),
        (0o1777, 0o777, None, "owner uid 0, mode 1777"),
        (0o777, 0o755, 0o755, "gm-cache/cpython"),
    ],
    ids=[
        "attacker-made-world-writable-dir",
        "another-users-dir",
        "roots-sticky-world-writable-dir",
        "another-users-tag-dir-in-roots-dir",
    ],
)
@runs_as_nobody
def test_planted_entry_never_runs(shared, precreated, attacker_mode, then, blamed):
    cache = shared / "gm-cache"
    if precreated is not None:
        cache.mkdir()
        cache.chmod(precreated)
    attack = _as_nobody(
        str(shared / "attack.py"),
        str(cache),
        str(shared / "src" / "gm_victim.py"),
        f"{attacker_mode:o}",
        str(shared / "attacker-home"),
        env={},
    )
    assert attack.returncode == 0, attack.stderr[-2000:]
    if then is not None:
        cache.chmod(then)

    victim = run_python("-W", "always", "-c", IMPORT_BOTH, env=_hook_env(shared, cache))

    assert victim.returncode == 0, victim.stderr[-2000:]
    assert "PWNED" not in victim.stdout
    assert "value 42" in victim.stdout
    assert "graphmend: gm_victim: rewritten" in victim.stderr  # rebuilt, not read
    assert victim.stderr.count("GraphMendWarning") == 1, victim.stderr
    assert blamed in victim.stderr and "does not use its cache" in victim.stderr
    # Nothing was written there either.
    assert [p for p in cache.rglob("*") if p.stat().st_uid == 0] == []


def test_another_users_link_to_a_directory_of_ours_is_not_followed(shared):
    # In a directory anyone may add to (the default graphmend-<uid> in /tmp, for a process
    # with no home), another user's link would choose where our entries go and are read.
    ours = shared / "ours"
    ours.mkdir(mode=0o755)
    link = shared / "gm-cache"
    link.symlink_to(ours)
    os.lchown(link, NOBODY, NOBODY)

    victim = run_python("-W", "always", "-c", IMPORT_BOTH, env=_hook_env(shared, link))

    assert victim.returncode == 0, victim.stderr[-2000:]
    assert "value 42" in victim.stdout and "gm_victim: rewritten" in victim.stderr
    assert victim.stderr.count("GraphMendWarning") == 1, victim.stderr
    assert "owner uid 65534" in victim.stderr and "symbolic link" in victim.stderr
    assert list(ours.iterdir()) == []


@runs_as_nobody
def test_root_warmed_cache_serves_another_user(shared):
    cache = shared / "warmed"
    env = _hook_env(shared, cache)
    warm = run_python("-m", "graphmend", "cache", "warm", "gm_victim", "gm_other", env=env)
    assert warm.returncode == 0, warm.stderr[-2000:]
    entries = sorted(cache.rglob("*.gmc"))
    assert len(entries) == 2
    assert {stat.S_IMODE(path.stat().st_mode) for path in [cache, entries[0].parent]} == {0o755}
    assert {stat.S_IMODE(path.stat().st_mode) for path in entries} == {0o644}
    before = {path: path.stat().st_mtime_ns for path in entries}

    served = _as_nobody("-W", "always", "-c", IMPORT_BOTH, env=env)

    assert served.returncode == 0, served.stderr[-2000:]
    assert "value 42" in served.stdout
    assert "gm_victim: cache hit" in served.stderr and "gm_other: cache hit" in served.stderr
    assert "GraphMendWarning" not in served.stderr
    assert {path: path.stat().st_mtime_ns for path in cache.rglob("*.gmc")} == before

    check = _as_nobody(
        "-c",
        f"from graphmend.cache import BytecodeCache; print(BytecodeCache({str(cache)!r}).check())",
        env={},
    )
    assert "Access.READ_ONLY" in check.stdout, check.stderr[-2000:]


@runs_as_nobody
def test_cache_made_by_the_hook_is_private(shared):
    cache = shared / "private"
    made = run_python("-c", IMPORT_BOTH, env=_hook_env(shared, cache))
    assert made.returncode == 0, made.stderr[-2000:]

    other = _as_nobody("-W", "always", "-c", IMPORT_BOTH, env=_hook_env(shared, cache))

    assert other.returncode == 0, other.stderr[-2000:]
    assert "value 42" in other.stdout and "gm_victim: rewritten" in other.stderr
    assert other.stderr.count("GraphMendWarning") == 1
    assert "cannot be read (Permission denied)" in other.stderr
