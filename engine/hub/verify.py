"""A snapshot's files checked against the hashes the hub reports for them, and the bad ones removed.

The cache volume may be shared between jobs (cache.claimName), and whatever can write to it could
leave a file that a later job would load as a model (weights, a tokenizer, a chat template). So
before the trainers are pointed at a snapshot, every file is hashed and compared with what the hub
API lists for the commit: an LFS file's sha256, any other file's git blob id (sha1 of
"blob <size>\\0" + content). A file that does not match is deleted, with the blob it links to, and
fetched again; files the hub does not list are removed from the snapshot.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class ExpectedFile:
    """A file of a commit as the hub lists it."""

    path: str
    sha256: str | None
    """LFS files: the content's sha256."""
    blob_id: str | None
    """Other files: the git blob id of the content."""

    @property
    def known(self) -> bool:
        return bool(self.sha256 or self.blob_id)


def expected_files(listing: Iterable[Any]) -> list[ExpectedFile]:
    """From huggingface_hub's records: RepoSibling (repo_info with files_metadata) or RepoFile (a tree listing)."""
    found = []
    for entry in listing:
        path = getattr(entry, "rfilename", None) or getattr(entry, "path", None)
        if path is None:
            continue
        lfs = getattr(entry, "lfs", None)
        sha256 = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) if lfs else None
        found.append(ExpectedFile(path=path, sha256=sha256, blob_id=None if sha256 else getattr(entry, "blob_id", None)))
    return found


def git_blob_id(path: Path) -> str:
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    _update(digest, path)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    _update(digest, path)
    return digest.hexdigest()


def _update(digest: Any, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)


def content_matches(path: Path, expected: ExpectedFile) -> bool:
    """Whether the file at `path` (a regular file or a link to one) holds what the hub listed."""
    if not path.is_file():
        return False
    if expected.sha256:
        return sha256_of(path) == expected.sha256
    if expected.blob_id:
        return git_blob_id(path) == expected.blob_id
    return False  # the hub gave no hash: nothing vouches for it


def mismatched(snapshot: Path, expected: list[ExpectedFile]) -> list[str]:
    """The listed files present in `snapshot` whose content is not what the hub listed (absent ones are not here)."""
    return [f.path for f in expected if os.path.lexists(snapshot / f.path) and not content_matches(snapshot / f.path, f)]


def unlisted(snapshot: Path, expected: list[ExpectedFile]) -> list[str]:
    """Files in `snapshot` that the hub does not list for the commit."""
    listed = {f.path for f in expected}
    found = []
    for root, _dirs, names in os.walk(snapshot):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), snapshot).replace(os.sep, "/")
            if relative not in listed:
                found.append(relative)
    return sorted(found)


def remove(storage: Path, snapshot: Path, paths: Iterable[str], expected: list[ExpectedFile]) -> None:
    """Delete each snapshot entry in `paths` and the blob it stands for, so that a new download replaces
    it (huggingface_hub would otherwise link the snapshot to the same blob again)."""
    by_path = {f.path: f for f in expected}
    blobs = (storage / "blobs").resolve()
    for relative in paths:
        entry = snapshot / relative
        targets = []
        if entry.is_symlink():
            target = entry.resolve()
            if target.parent == blobs:
                targets.append(target)
        wanted = by_path.get(relative)
        if wanted is not None and (wanted.sha256 or wanted.blob_id):
            targets.append(blobs / (wanted.sha256 or wanted.blob_id or ""))  # the blob named by its hash
        for path in [entry, *targets]:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
