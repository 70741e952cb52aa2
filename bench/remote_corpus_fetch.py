"""Download the published files of the ``trust_remote_code`` corpus.

The model code of ``bench/remote_corpus/`` belongs to its publishers and is not
part of this repository: ``manifest.json`` records, for each family, the public
repository, the commit and the sha256 of every file, and each family's folder
holds only ``config.json``, a tiny configuration of ours.  This fetches each
file at its commit into the family's folder (ignored by git) and keeps it only
when its sha256 is the manifest's; a file already there with the right bytes
is not fetched again.

    python bench/remote_corpus_fetch.py [--only REGEX] [--source TEMPLATE]

``--source`` is where a file is read from, with ``{repository}`` (``owner/name``),
``{commit}`` and ``{path}`` filled in (default: GitHub's raw files).  Exits 1,
with one line per file, when any file could not be had.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from remote_corpus import CORPUS, load_manifest

RAW_GITHUB = "https://raw.githubusercontent.com/{repository}/{commit}/{path}"
GITHUB = "https://github.com/"


def file_url(family: dict[str, Any], entry: dict[str, str], source: str = RAW_GITHUB) -> str:
    """Where one published file of a family is read from."""
    repository = family["repository"].removeprefix(GITHUB).strip("/")
    return source.format(repository=repository, commit=family["commit"], path=entry["path"])


def fetch_family(
    name: str,
    family: dict[str, Any],
    corpus: Path = CORPUS,
    source: str = RAW_GITHUB,
    timeout: float = 60,
) -> list[str]:
    """Fetch the family's files that are missing or differ; the problems, one line each."""
    problems = []
    for entry in family["files"]:
        target = corpus / name / entry["file"]
        if target.is_file() and _sha256(target.read_bytes()) == entry["sha256"]:
            continue
        url = file_url(family, entry, source)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                data = response.read()
        except (urllib.error.URLError, OSError, ValueError) as error:
            problems.append(f"{name}/{entry['file']}: cannot read {url}: {error}")
            continue
        if _sha256(data) != entry["sha256"]:
            problems.append(
                f"{name}/{entry['file']}: {url} has sha256 {_sha256(data)}, "
                f"not the manifest's {entry['sha256']}; not written"
            )
            continue
        partial = target.with_name(f".{target.name}.partial")
        partial.write_bytes(data)
        partial.replace(target)
    return problems


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", metavar="REGEX", help="families to fetch (re.search)")
    parser.add_argument(
        "--source", default=RAW_GITHUB, help="URL template ({repository}, {commit}, {path})"
    )
    options = parser.parse_args(argv)
    manifest = load_manifest()
    names = [name for name in manifest if options.only is None or re.search(options.only, name)]
    if not names:
        print(f"no family matches {options.only!r}", file=sys.stderr)
        return 2
    problems = []
    for name in names:
        problems.extend(fetch_family(name, manifest[name], CORPUS, options.source))
    for problem in problems:
        print(problem, file=sys.stderr)
    files = sum(len(manifest[name]["files"]) for name in names)
    print(f"{files - len(problems)} of {files} files of {len(names)} families in place")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
