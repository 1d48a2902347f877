"""`kuberl initialize`: fetch every hub repository a job names into the cache volume, once, before the trainers start.

On a cluster one initializer pod runs this with the job's engine config (KUBERL_CONFIG), the cache
volume as HF_HUB_CACHE and the hub token (if any) as HF_TOKEN from a Secret. The trainer pods then
mount the cache read-only and run with HF_HUB_OFFLINE=1 (resolve.py), so whatever they load must be
here, complete, under the refs they will ask for.

For each source (model, tokenizer, reward.model):
- a revision that is already a commit whose snapshot is complete in the cache costs no request at all
  (a restarted job, or a later job sharing the claim, must not depend on the hub being up);
- otherwise the hub resolves the revision to a commit and lists the files with their sizes; if the
  files the cache lacks do not fit on the volume, it stops before downloading anything; then
  huggingface_hub's snapshot_download fetches what is missing (files are keyed by commit and content,
  so nothing already there is fetched again), and only then the branch's ref is written, so a
  trainer that reads refs/<branch> always finds a complete snapshot.

It writes an InitializationReport (engine/config/initialization.py) to the termination log, for the
operator, prints one line for people on stdout and its progress on stderr, and exits 0 on success,
PERMANENT_FAILURE_EXIT_CODE when retrying cannot help (no such repository or revision, a refused
token, a full volume) and 1 otherwise (the hub unreachable, a failed download): its Job retries those.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config.initialization import (
    PERMANENT_FAILURE_EXIT_CODE,
    TERMINATION_MESSAGE_LIMIT,
    FetchedRepo,
    InitializationReport,
    hub_sources,
)
from .config.model import WeightsSource
from .config.topology import EngineConfig

log = logging.getLogger("kuberl.initializer")

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Transient failures (the hub unreachable or answering 5xx) are retried with doubling waits, within
# this many seconds per repository (KUBERL_HUB_RETRY_SECONDS); the pod's activeDeadlineSeconds bounds the rest.
DEFAULT_RETRY_SECONDS = 120.0
MAX_ATTEMPTS = 6
# HF_HUB_ETAG_TIMEOUT's default in huggingface_hub: it bounds its metadata requests.
DEFAULT_REQUEST_TIMEOUT = 10.0
_TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
# Failures that a later try may not meet again: the initializer's Job retries them.
RETRIED_REASONS = ("HubUnreachable", "DownloadFailed")
MESSAGE_LIMIT = 1024  # InitializationReport.message's bound


class InitializationFailed(Exception):
    """A repository could not be fetched; `message` says which field, what failed and how to fix it."""

    def __init__(self, reason: str, message: str, *, transient: bool = False):
        super().__init__(message)
        self.reason, self.message, self.transient = reason, message, transient


@dataclass(frozen=True)
class Hub:
    """Where and how to fetch: the endpoint, the cache folder and the token (never logged)."""

    endpoint: str
    cache_dir: Path
    token: str | None
    retry_seconds: float = DEFAULT_RETRY_SECONDS

    def redact(self, text: str) -> str:
        # A token never reaches a message: huggingface_hub's errors do not carry it, and this makes sure.
        return text.replace(self.token, "***") if self.token and len(self.token) >= 8 else text


def main() -> int:
    """`kuberl initialize`: see the module's docstring. Reads KUBERL_CONFIG (the engine config file)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, datefmt="%H:%M:%S",
                        format="%(asctime)s initialize %(levelname)s %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # a line per request: the progress lines say enough
    config_path = os.environ.get("KUBERL_CONFIG")
    try:
        if not config_path:
            raise ValueError("KUBERL_CONFIG is not set: it names the engine config (JSON) the operator renders")
        config = EngineConfig.model_validate_json(Path(config_path).read_text())
    except (OSError, ValueError) as exc:
        report = InitializationReport(reason="DownloadFailed", message=_clip(f"cannot read the engine config: {exc}"))
        _finish(report)
        return 2
    hub = hub_from_environ(os.environ)
    report = initialize(config, hub)
    _finish(report)
    return exit_code(report)


def exit_code(report: InitializationReport) -> int:
    """0 on success; PERMANENT_FAILURE_EXIT_CODE where retrying cannot help, so the Job fails at once; else 1."""
    if report.ok:
        return 0
    return 1 if report.reason in RETRIED_REASONS else PERMANENT_FAILURE_EXIT_CODE


def hub_from_environ(environ: Mapping[str, str]) -> Hub:
    """The hub settings of this process, and huggingface_hub set up for a pod before its first import.

    huggingface_hub reads HF_ENDPOINT, its timeouts and HF_HUB_DISABLE_* once, when it is imported, so the
    defaults go into the environment first; the endpoint is also passed to every call, which works even if
    something imported huggingface_hub earlier.
    """
    # The user-agent header asks the hub for a registry of AI agents (telemetry, once a day) unless this is
    # set: a cluster job has no use for it, and on an air-gapped mirror it is a request that fails.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # pod logs: one line per repository instead
    endpoint = (environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    cache = environ.get("HF_HUB_CACHE")
    if cache is None:
        from huggingface_hub import constants

        cache = constants.HF_HUB_CACHE
    retry = float(environ.get("KUBERL_HUB_RETRY_SECONDS") or DEFAULT_RETRY_SECONDS)
    # A token has no whitespace; a Secret made from a file often ends with a newline, which no header may carry.
    token = (environ.get("HF_TOKEN") or "").strip() or None
    return Hub(endpoint=endpoint, cache_dir=Path(cache).expanduser().resolve(), token=token, retry_seconds=retry)


def initialize(config: EngineConfig, hub: Hub) -> InitializationReport:
    """Fetch every hub source of `config` into the cache; stops at the first that fails."""
    _bound_request_timeouts()
    fetched: list[FetchedRepo] = []
    for field, source in hub_sources(config):
        try:
            fetched.append(fetch(field, source, hub))
        except InitializationFailed as failure:
            log.error("%s (%s)", failure.message, failure.reason)
            return InitializationReport(repos=fetched, reason=failure.reason, message=_clip(failure.message))
    return InitializationReport(repos=fetched)


def fetch(field: str, source: WeightsSource, hub: Hub) -> FetchedRepo:
    """One source into the cache: from the cache alone when its commit is complete there, else from the hub."""
    repo = source.hub_id
    assert repo is not None
    if source.revision is not None and COMMIT.fullmatch(source.revision):
        snapshot = complete_snapshot(hub.cache_dir, repo, source.revision)
        if snapshot is not None:
            files, size = _snapshot_size(snapshot)
            log.info("%s.hubId %s@%s: complete in the cache (%d files, %s), nothing to fetch",
                     field, repo, source.revision[:12], files, _human(size))
            return FetchedRepo(field=field, repo=repo, revision=source.revision, commit=source.revision, files=files,
                               bytes=size)
    started = time.monotonic()
    wait, attempt = 1.0, 1
    while True:
        try:
            return _fetch_online(field, source, hub)
        except Exception as exc:  # every failure is classified: the report must say why
            failure = exc if isinstance(exc, InitializationFailed) else classify(exc, field, source, hub)
            failure.message = hub.redact(failure.message)  # before it is logged
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
    info = api.repo_info(repo, revision=source.revision, files_metadata=True, timeout=_request_timeout())
    commit = info.sha
    if commit is None or not COMMIT.fullmatch(commit):
        raise InitializationFailed("DownloadFailed", f"{field}.hubId {repo}: the hub at {hub.endpoint} named no commit "
                                   f"for revision {source.revision or 'main'}: is HF_ENDPOINT a Hugging Face hub?")
    storage = hub.cache_dir / repo_folder(repo)
    blobs = storage / "blobs"
    # A file the cache already holds (by content: the blob's name is its ETag) takes no space.
    missing = sum(s.size or 0 for s in info.siblings or [] if not (blobs / _blob_name(s)).exists())
    hub.cache_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(hub.cache_dir).free
    if missing > free:
        raise InitializationFailed("CacheVolumeFull", (
            f"{field}.hubId {repo}@{commit[:12]}: needs {_human(missing)} more in the cache volume, which has "
            f"{_human(free)} free: give the job a larger cache (cache.size, or a larger cache.claimName)"))
    before = _folder_bytes(blobs)
    log.info("%s.hubId %s: revision %s is commit %s; fetching %s", field, repo, source.revision or "main", commit,
             _human(missing) if missing else "nothing new")
    folder = Path(snapshot_download(repo, revision=commit, cache_dir=hub.cache_dir, token=hub.token or False,
                                    endpoint=hub.endpoint, etag_timeout=_request_timeout()))
    fetched = max(0, _folder_bytes(blobs) - before)
    # snapshot_download returns a cached folder as it is when the hub fails it halfway and it cannot tell
    # whether the folder is complete: the trainers must never be pointed at a partial snapshot.
    absent = [s.rfilename for s in info.siblings or [] if not (folder / s.rfilename).is_file()]
    if absent:
        raise InitializationFailed("DownloadFailed", (
            f"{field}.hubId {repo}@{commit[:12]}: {len(absent)} files missing after the download "
            f"({', '.join(absent[:3])}): the hub stopped answering halfway"), transient=True)
    if source.revision != commit:
        # After the download, never before: refs/<branch> only ever names a complete snapshot.
        _write_ref(storage, source.revision or "main", commit)
    files, size = _snapshot_size(folder)
    log.info("%s.hubId %s@%s: %d files, %s in the cache, %s downloaded", field, repo, commit[:12], files,
             _human(size), _human(fetched))
    return FetchedRepo(field=field, repo=repo, revision=source.revision, commit=commit, files=files, bytes=size,
                       fetched_bytes=fetched)


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


def classify(exc: BaseException, field: str, source: WeightsSource, hub: Hub) -> InitializationFailed:
    """The reason and the message for people of a failure of huggingface_hub (or of the disk under it)."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision = source.hub_id, source.revision or "main"
    where = f"{field}.hubId {repo}"
    ref = source.token_secret_ref
    token_from = f"{field}.tokenSecretRef (Secret {ref.name}, key {ref.key})" if ref else "HF_TOKEN"
    chain = _chain(exc)
    # snapshot_download wraps what went wrong (in LocalEntryNotFoundError, OSError, ...): the cause decides.
    for err in chain:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return InitializationFailed("CacheVolumeFull", (
                f"{where}: the cache volume {hub.cache_dir} ran out of space while downloading: give the job a "
                f"larger cache (cache.size, or a larger cache.claimName)"))
    for err in chain:
        if isinstance(err, GatedRepoError):
            return InitializationFailed("TokenRefused", (
                f"{where} is gated and the hub refused access with the token from {token_from}"
                f"{'' if hub.token else ' (none given)'}: accept the model's conditions on the hub with the "
                f"token's account, and check the Secret's key"))
        if isinstance(err, RevisionNotFoundError):
            return InitializationFailed("RevisionNotFound", (
                f"{field}.revision {revision}: {repo} has no such branch, tag or commit on the hub at "
                f"{hub.endpoint}: check {field}.revision"))
        if isinstance(err, HfHubHTTPError) and _status(err) in (401, 403):
            status = _status(err)
            if not hub.token:
                return InitializationFailed("RepositoryNotFound", (
                    f"{where}: the hub at {hub.endpoint} answered {status} to a request without a token: no such "
                    f"repository, or it is private or gated: check {field}.hubId, or set {field}.tokenSecretRef to "
                    f"a Secret with a token that can read it"))
            if status == 401:
                check = "that the Secret's key holds a valid hub token" if ref else "HF_TOKEN"
                return InitializationFailed("TokenRefused", (
                    f"{where}: the hub refused the token from {token_from} (401): check {check}"))
            return InitializationFailed("TokenRefused", (
                f"{where}: the token from {token_from} may not read this repository (403): give the token read "
                f"access to it"))
        if isinstance(err, RepositoryNotFoundError):
            can_read = f", or the token from {token_from} cannot read it" if hub.token else ""
            return InitializationFailed("RepositoryNotFound", (
                f"{where}: the hub at {hub.endpoint} has no such repository{can_read}: check {field}.hubId"))
        if isinstance(err, RemoteEntryNotFoundError):
            return InitializationFailed("DownloadFailed", (
                f"{where}@{revision}: a file the hub listed is missing from it ({_brief(err)}): try again later"))
        if isinstance(err, HfHubHTTPError) and _status(err) in _TRANSIENT_STATUS:
            return InitializationFailed("HubUnreachable", (
                f"{where}: the hub at {hub.endpoint} answered {_status(err)}: it is down or overloaded"),
                transient=True)
        if isinstance(err, OfflineModeIsEnabled):
            return InitializationFailed("DownloadFailed", (
                f"{where}: HF_HUB_OFFLINE is set in the initializer: remove it from initializer.env"))
        if isinstance(err, httpx2.ProxyError):
            return InitializationFailed("HubUnreachable", (
                f"{where}: the proxy refused the way to the hub at {hub.endpoint} ({_brief(err)}): check "
                f"HTTPS_PROXY in initializer.env"), transient=True)
        if isinstance(err, (httpx2.TransportError, TimeoutError, ConnectionError)):
            return InitializationFailed("HubUnreachable", (
                f"{where}: cannot reach the hub at {hub.endpoint} ({type(err).__name__}: {_brief(err)}): check "
                f"the cluster's way out to it (egress, DNS, a proxy in initializer.env) or HF_ENDPOINT"),
                transient=True)
    return InitializationFailed("DownloadFailed", f"{where}@{revision}: download failed: {type(exc).__name__}: "
                                f"{_brief(exc)}")


def repo_folder(repo: str) -> str:
    """A model repository's folder in the hub cache (huggingface_hub's documented layout: models--org--name)."""
    return "--".join(["models", *repo.split("/")])


def _bound_request_timeouts() -> None:
    """Give every request of huggingface_hub a timeout.

    Its metadata and download requests have one (HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT), but some
    API calls (the file listing that snapshot_download makes) pass none, and a hub that accepts the
    connection and never answers would hold the pod until its deadline. So the shared client gets a
    request hook that fills in whatever timeout a request lacks.
    """
    import httpx2
    import huggingface_hub

    template = huggingface_hub.get_session()
    if any(getattr(h, "__name__", "") == _fill_timeouts.__name__ for h in template.event_hooks["request"]):
        return
    hooks = {"request": [*template.event_hooks["request"], _fill_timeouts], "response": template.event_hooks["response"]}
    follow = template.follow_redirects
    huggingface_hub.set_client_factory(lambda: httpx2.Client(event_hooks=hooks, follow_redirects=follow, timeout=None))


def _fill_timeouts(request: Any) -> None:
    timeouts = dict(request.extensions.get("timeout") or {})
    if any(timeouts.get(k) is None for k in ("connect", "read", "write", "pool")):
        limit = _request_timeout()
        for k in ("connect", "read", "write", "pool"):
            if timeouts.get(k) is None:
                timeouts[k] = limit
        request.extensions = {**request.extensions, "timeout": timeouts}


def _request_timeout() -> float:
    return float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or DEFAULT_REQUEST_TIMEOUT)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending:
        err = pending.pop(0)
        if err is None or any(err is s for s in seen):
            continue
        seen.append(err)
        pending += [err.__cause__, err.__context__]
    return seen


def _status(err: Any) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def _brief(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__


def _blob_name(sibling: Any) -> str:
    # The cache names a blob by the file's ETag: the sha256 of an LFS file, the git blob id of any other.
    return sibling.lfs.sha256 if sibling.lfs is not None else (sibling.blob_id or "")


def _folder_bytes(folder: Path) -> int:
    """Bytes of the finished blobs in `folder` (downloads in progress, *.incomplete, are not counted)."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return 0
    return sum(e.stat().st_size for e in entries if e.is_file(follow_symlinks=False) and not e.name.endswith(".incomplete"))


def _snapshot_size(folder: Path) -> tuple[int, int]:
    """Files and bytes of a snapshot (its entries are links to blobs: the sizes are the blobs')."""
    files = size = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            files += 1
            size += os.stat(os.path.join(root, name)).st_size
    return files, size


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


def _finish(report: InitializationReport) -> None:
    """The report to the termination log (for the operator), a line for people on stdout."""
    path = os.environ.get("KUBERL_TERMINATION_LOG") or DEFAULT_TERMINATION_LOG
    try:
        Path(path).write_text(_fit(report))
    except OSError as exc:  # not in a pod (no /dev/termination-log): the summary line still says it
        log.debug("cannot write the termination log %s: %s", path, exc)
    print(summary(report), flush=True)


def _fit(report: InitializationReport) -> str:
    """The report as JSON within the termination message's limit: the message gives way if needed."""
    while True:
        text = report.model_dump_json(by_alias=True, exclude_none=True)
        if len(text.encode()) <= TERMINATION_MESSAGE_LIMIT or not report.message:
            return report.to_json()
        shorter = len(report.message) * 3 // 4
        report = report.model_copy(update={"message": _clip(report.message, shorter) if shorter >= 16 else None})


def summary(report: InitializationReport) -> str:
    if not report.ok:
        return f"kuberl initialize failed ({report.reason}): {report.message}"
    repos = ", ".join(f"{r.field} {r.repo}@{r.commit[:12]} ({r.files} files, {_human(r.bytes)})" for r in report.repos)
    count = f"{len(report.repos)} {'repository' if len(report.repos) == 1 else 'repositories'}"
    return (f"kuberl initialize: {count} in the cache, {_human(report.fetched_bytes)} downloaded"
            + (f": {repos}" if repos else ""))


def _clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


if __name__ == "__main__":
    sys.exit(main())
