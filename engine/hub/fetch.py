"""One hub repository into the cache, every file checked against the hashes the hub lists for its commit
(verify.py): from the hub's listing when it answers, with bounded retries of what may pass (an unreachable
hub, a failed download); a commit complete in the cache is checked against the listing recorded when it
was downloaded only while the hub cannot be reached, so a restarted job does not depend on the hub."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from ..config.initialization import FetchedRepo
from ..config.model import WeightsSource
from .cache import blob_name, complete_snapshot, folder_bytes, repo_folder, snapshot_size, write_ref
from .failures import InitializationFailed, classify
from .http import request_timeout
from .report import human_bytes
from .settings import COMMIT, MAX_ATTEMPTS, Hub
from .verify import ExpectedFile, expected_files, mismatched, remove, unlisted

log = logging.getLogger("kuberl.initializer")


def fetch(field: str, source: WeightsSource, hub: Hub) -> FetchedRepo:
    """One source into the cache: from the cache alone when its commit is complete there, else from the hub."""
    repo = source.hub_id
    assert repo is not None
    started = time.monotonic()
    wait, attempt = 1.0, 1
    while True:
        try:
            return _fetch_online(field, source, hub)
        except Exception as exc:  # every failure is classified: the report must say why
            failure = exc if isinstance(exc, InitializationFailed) else classify(exc, field, source, hub)
            failure.message = hub.redact(failure.message)  # before it is logged
        if failure.transient and source.revision is not None and COMMIT.fullmatch(source.revision):
            cached = _verified_from_cache(field, repo, source.revision, hub)
            if cached is not None:
                log.warning(
                    "%s; the commit is complete in the cache and matches the file list recorded when it was downloaded: using it",
                    failure.message,
                )
                return cached
        elapsed = time.monotonic() - started
        if not failure.transient or attempt >= MAX_ATTEMPTS or elapsed + wait > hub.retry_seconds:
            if failure.transient:
                failure.message += f" (tried {attempt} times in {elapsed:.0f} s)"
            raise failure
        log.warning("%s; retrying in %.0f s (attempt %d)", failure.message, wait, attempt + 1)
        time.sleep(wait)
        wait, attempt = wait * 2, attempt + 1


def _fetch_online(field: str, source: WeightsSource, hub: Hub) -> FetchedRepo:
    from huggingface_hub import HfApi, snapshot_download

    repo = source.hub_id
    assert repo is not None
    api = HfApi(endpoint=hub.endpoint, token=hub.token or False)
    info = api.model_info(repo, revision=source.revision, files_metadata=True, timeout=request_timeout())
    commit = info.sha
    if commit is None or not COMMIT.fullmatch(commit):
        raise InitializationFailed(
            "DownloadFailed",
            f"{field}.hubId {repo}: the hub at {hub.endpoint} named no commit "
            f"for revision {source.revision or 'main'}: is HF_ENDPOINT a Hugging Face hub?",
        )
    storage = hub.cache_dir / repo_folder(repo)
    blobs = storage / "blobs"
    expected = expected_files(info.siblings or [])
    unvouched = [f.path for f in expected if not f.known]
    if unvouched:
        raise InitializationFailed(
            "DownloadFailed",
            f"{field}.hubId {repo}@{commit[:12]}: the hub at {hub.endpoint} lists "
            f"no hash for {', '.join(unvouched[:3])}: nothing vouches for their content",
        )
    snapshot = storage / "snapshots" / commit
    present = [f for f in expected if (snapshot / f.path).is_file()]
    dropped = _drop_mismatched(field, repo, commit, storage, snapshot, expected)  # before the download, which would keep them
    checked = {f.path for f in present} - set(dropped)  # hashed and good: not hashed again after the download
    # A file the cache already holds (by content: the blob's name is its ETag) takes no space.
    missing = sum(s.size or 0 for s in info.siblings or [] if not (blobs / blob_name(s)).exists())
    hub.cache_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(hub.cache_dir).free
    if missing > free:
        raise InitializationFailed(
            "CacheVolumeFull",
            (
                f"{field}.hubId {repo}@{commit[:12]}: needs {human_bytes(missing)} more in the cache volume, which has "
                f"{human_bytes(free)} free: give the job a larger cache (cache.size, or a larger cache.claimName)"
            ),
        )
    before = folder_bytes(blobs)
    log.info(
        "%s.hubId %s: revision %s is commit %s; fetching %s",
        field,
        repo,
        source.revision or "main",
        commit,
        human_bytes(missing) if missing else "nothing new",
    )
    folder = Path(
        snapshot_download(
            repo, revision=commit, cache_dir=hub.cache_dir, token=hub.token or False, endpoint=hub.endpoint, etag_timeout=request_timeout()
        )
    )
    if _drop_mismatched(field, repo, commit, storage, folder, [f for f in expected if f.path not in checked]):
        folder = Path(
            snapshot_download(
                repo,
                revision=commit,
                cache_dir=hub.cache_dir,
                token=hub.token or False,
                endpoint=hub.endpoint,
                etag_timeout=request_timeout(),
            )
        )
        still = mismatched(folder, expected)
        if still:
            remove(storage, folder, still, expected)
            raise InitializationFailed(
                "ContentMismatch",
                (
                    f"{field}.hubId {repo}@{commit[:12]}: {', '.join(still[:3])} fetched again from {hub.endpoint} and still "
                    "not what the hub lists for it (sha256 / git blob id): the hub or a proxy in between serves other "
                    "content; check HF_ENDPOINT and the proxy"
                ),
            )
    extra = unlisted(folder, expected)
    if extra:
        log.warning(
            "%s.hubId %s@%s: removing %d files the hub does not list (%s)", field, repo, commit[:12], len(extra), ", ".join(extra[:3])
        )
        remove(storage, folder, extra, expected)
    fetched = max(0, folder_bytes(blobs) - before)
    # snapshot_download returns a cached folder as it is when the hub fails it halfway and it cannot tell
    # whether the folder is complete: the trainers must never be pointed at a partial snapshot.
    absent = [s.rfilename for s in info.siblings or [] if not (folder / s.rfilename).is_file()]
    if absent:
        raise InitializationFailed(
            "DownloadFailed",
            (
                f"{field}.hubId {repo}@{commit[:12]}: {len(absent)} files missing after the download "
                f"({', '.join(absent[:3])}): the hub stopped answering halfway"
            ),
            transient=True,
        )
    if source.revision != commit:
        # After the download, never before: refs/<branch> only ever names a complete snapshot.
        write_ref(storage, source.revision or "main", commit)
    files, size = snapshot_size(folder)
    log.info(
        "%s.hubId %s@%s: %d files, %s in the cache, %s downloaded", field, repo, commit[:12], files, human_bytes(size), human_bytes(fetched)
    )
    return FetchedRepo(field=field, repo=repo, revision=source.revision, commit=commit, files=files, bytes=size, fetched_bytes=fetched)


def _drop_mismatched(field: str, repo: str, commit: str, storage: Path, snapshot: Path, expected: list[ExpectedFile]) -> list[str]:
    """Delete the snapshot's files whose content is not what the hub lists (with their blobs); their names."""
    if not snapshot.is_dir():
        return []
    bad = mismatched(snapshot, expected)
    if bad:
        log.warning(
            "%s.hubId %s@%s: %d cached files do not match the hub's hashes (%s): deleted, fetching them again",
            field,
            repo,
            commit[:12],
            len(bad),
            ", ".join(bad[:3]),
        )
        remove(storage, snapshot, bad, expected)
    return bad


def _verified_from_cache(field: str, repo: str, commit: str, hub: Hub) -> FetchedRepo | None:
    """The commit's snapshot when it is complete in the cache and every file matches the listing that
    huggingface_hub recorded from the hub when it downloaded it; None otherwise."""
    # huggingface_hub's own reader of the listing it recorded: its public get_cached_repo_tree drops the LFS sha256.
    from huggingface_hub._tree_cache import read_tree_cache

    snapshot = complete_snapshot(hub.cache_dir, repo, commit)
    entries = read_tree_cache(str(hub.cache_dir / repo_folder(repo)), commit) if snapshot is not None else None
    if snapshot is None or entries is None:
        return None
    expected = [ExpectedFile(path=path, sha256=e.lfs_sha256, blob_id=None if e.lfs_sha256 else e.blob_id) for path, e in entries.items()]
    if not all(f.known for f in expected) or mismatched(snapshot, expected) or unlisted(snapshot, expected):
        return None
    files, size = snapshot_size(snapshot)
    log.info(
        "%s.hubId %s@%s: complete and verified in the cache (%d files, %s), nothing fetched",
        field,
        repo,
        commit[:12],
        files,
        human_bytes(size),
    )
    return FetchedRepo(field=field, repo=repo, revision=commit, commit=commit, files=files, bytes=size)
