"""The hub cache's layout (huggingface_hub's documented one): repository folders, snapshots, blobs and refs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..common.hub_folders import endpoint_cache_dir  # noqa: F401 - the cache layout's, re-exported


def repo_folder(repo: str) -> str:
    """A model repository's folder in the hub cache (huggingface_hub's documented layout: models--org--name)."""
    return "--".join(["models", *repo.split("/")])


def complete_snapshot(cache_dir: Path, repo: str, commit: str) -> Path | None:
    """The snapshot folder of `commit` when the cache holds every file of it, without any request.

    Complete means: the commit's file list, which snapshot_download keeps in the cache (trees/<commit>.json),
    names no file the snapshot lacks. Without that list completeness cannot be known, and the hub is asked.
    """
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        listed = get_cached_repo_tree(repo, revision=commit, cache_dir=cache_dir)
    except CachedRepoTreeNotFoundError:
        return None
    folder = cache_dir / repo_folder(repo) / "snapshots" / commit
    if not all((folder / f.path).is_file() for f in listed):
        return None
    return folder


def blob_name(sibling: Any) -> str:
    # The cache names a blob by the file's ETag: the sha256 of an LFS file, the git blob id of any other.
    return sibling.lfs.sha256 if sibling.lfs is not None else (sibling.blob_id or "")


def folder_bytes(folder: Path) -> int:
    """Bytes of the finished blobs in `folder` (downloads in progress, *.incomplete, are not counted)."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return 0
    return sum(e.stat().st_size for e in entries if e.is_file(follow_symlinks=False) and not e.name.endswith(".incomplete"))


def snapshot_size(folder: Path) -> tuple[int, int]:
    """Files and bytes of a snapshot (its entries are links to blobs: the sizes are the blobs')."""
    files = size = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            files += 1
            size += os.stat(os.path.join(root, name)).st_size
    return files, size


def write_ref(storage: Path, revision: str, commit: str) -> None:
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)
