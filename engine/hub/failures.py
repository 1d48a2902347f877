"""Why a repository could not be fetched: huggingface_hub's errors (or the disk's) as a reason for machines
and a message for people that names the field, what failed and how to fix it."""

from __future__ import annotations

import errno
from typing import Any

from ..config.model import WeightsSource
from .settings import Hub

TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)


# Failures that a later try may not meet again: the initializer's Job retries them.
RETRIED_REASONS = ("HubUnreachable", "DownloadFailed")


class InitializationFailed(Exception):
    """A repository could not be fetched; `message` says which field, what failed and how to fix it."""

    def __init__(self, reason: str, message: str, *, transient: bool = False):
        super().__init__(message)
        self.reason, self.message, self.transient = reason, message, transient


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
            return InitializationFailed(
                "CacheVolumeFull",
                (
                    f"{where}: the cache volume {hub.cache_dir} ran out of space while downloading: give the job a "
                    f"larger cache (cache.size, or a larger cache.claimName)"
                ),
            )
    for err in chain:
        if isinstance(err, GatedRepoError):
            return InitializationFailed(
                "TokenRefused",
                (
                    f"{where} is gated and the hub refused access with the token from {token_from}"
                    f"{'' if hub.token else ' (none given)'}: accept the model's conditions on the hub with the "
                    f"token's account, and check the Secret's key"
                ),
            )
        if isinstance(err, RevisionNotFoundError):
            return InitializationFailed(
                "RevisionNotFound",
                (
                    f"{field}.revision {revision}: {repo} has no such branch, tag or commit on the hub at "
                    f"{hub.endpoint}: check {field}.revision"
                ),
            )
        if isinstance(err, HfHubHTTPError) and _status(err) in (401, 403):
            status = _status(err)
            if not hub.token:
                return InitializationFailed(
                    "RepositoryNotFound",
                    (
                        f"{where}: the hub at {hub.endpoint} answered {status} to a request without a token: no such "
                        f"repository, or it is private or gated: check {field}.hubId, or set {field}.tokenSecretRef to "
                        f"a Secret with a token that can read it"
                    ),
                )
            if status == 401:
                check = "that the Secret's key holds a valid hub token" if ref else "HF_TOKEN"
                return InitializationFailed("TokenRefused", (f"{where}: the hub refused the token from {token_from} (401): check {check}"))
            return InitializationFailed(
                "TokenRefused",
                (f"{where}: the token from {token_from} may not read this repository (403): give the token read access to it"),
            )
        if isinstance(err, RepositoryNotFoundError):
            can_read = f", or the token from {token_from} cannot read it" if hub.token else ""
            return InitializationFailed(
                "RepositoryNotFound", (f"{where}: the hub at {hub.endpoint} has no such repository{can_read}: check {field}.hubId")
            )
        if isinstance(err, RemoteEntryNotFoundError):
            return InitializationFailed(
                "DownloadFailed", (f"{where}@{revision}: a file the hub listed is missing from it ({_brief(err)}): try again later")
            )
        if isinstance(err, HfHubHTTPError) and _status(err) in TRANSIENT_STATUS:
            return InitializationFailed(
                "HubUnreachable", (f"{where}: the hub at {hub.endpoint} answered {_status(err)}: it is down or overloaded"), transient=True
            )
        if isinstance(err, OfflineModeIsEnabled):
            return InitializationFailed(
                "DownloadFailed", (f"{where}: HF_HUB_OFFLINE is set in the initializer: remove it from initializer.env")
            )
        if isinstance(err, httpx2.ProxyError):
            return InitializationFailed(
                "HubUnreachable",
                (f"{where}: the proxy refused the way to the hub at {hub.endpoint} ({_brief(err)}): check HTTPS_PROXY in initializer.env"),
                transient=True,
            )
        if isinstance(err, (httpx2.TransportError, TimeoutError, ConnectionError)):
            return InitializationFailed(
                "HubUnreachable",
                (
                    f"{where}: cannot reach the hub at {hub.endpoint} ({type(err).__name__}: {_brief(err)}): check "
                    f"the cluster's way out to it (egress, DNS, a proxy in initializer.env) or HF_ENDPOINT"
                ),
                transient=True,
            )
    return InitializationFailed("DownloadFailed", f"{where}@{revision}: download failed: {type(exc).__name__}: {_brief(exc)}")


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
