"""`kuberl initialize`: fetch every hub repository a job names into the cache volume, once, before the trainers start.

On a cluster one initializer pod runs this with the job's engine config (KUBERL_CONFIG), the cache
volume as HF_HUB_CACHE and the hub token (if any) as HF_TOKEN from a Secret. The trainer pods then
mount the cache read-only and run with HF_HUB_OFFLINE=1 (models/resolve.py), so whatever they load must be
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

import logging
import os
import sys
from pathlib import Path

from ..config.initialization import FetchedRepo, InitializationReport, hub_sources
from ..config.topology import EngineConfig
from .failures import InitializationFailed
from .fetch import fetch
from .http import bound_request_timeouts
from .report import clip, exit_code, finish
from .settings import Hub, hub_from_environ

log = logging.getLogger("kuberl.initializer")


def main() -> int:
    """`kuberl initialize`: see the module's docstring. Reads KUBERL_CONFIG (the engine config file)."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, datefmt="%H:%M:%S", format="%(asctime)s initialize %(levelname)s %(message)s"
    )
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # a line per request: the progress lines say enough
    config_path = os.environ.get("KUBERL_CONFIG")
    try:
        if not config_path:
            raise ValueError("KUBERL_CONFIG is not set: it names the engine config (JSON) the operator renders")
        config = EngineConfig.model_validate_json(Path(config_path).read_text())
    except (OSError, ValueError) as exc:
        report = InitializationReport(reason="DownloadFailed", message=clip(f"cannot read the engine config: {exc}"))
        finish(report)
        return 2
    hub = hub_from_environ(os.environ)
    report = initialize(config, hub)
    finish(report)
    return exit_code(report)


def initialize(config: EngineConfig, hub: Hub) -> InitializationReport:
    """Fetch every hub source of `config` into the cache; stops at the first that fails."""
    bound_request_timeouts()
    fetched: list[FetchedRepo] = []
    for field, source in hub_sources(config):
        try:
            fetched.append(fetch(field, source, hub))
        except InitializationFailed as failure:
            log.error("%s (%s)", failure.message, failure.reason)
            return InitializationReport(repos=fetched, reason=failure.reason, message=clip(failure.message))
        if field == "model":
            refused = _refused_model(fetched[-1], config, hub)
            if refused is not None:
                log.error("%s", refused)
                return InitializationReport(repos=fetched, reason="UnsupportedModel", message=clip(refused))
    return InitializationReport(repos=fetched)


def _refused_model(repo: FetchedRepo, config: EngineConfig, hub: Hub) -> str | None:
    """Why the engine cannot train the model just fetched as the job lays it out, read from its config.json
    in the cache: said now, before any trainer pod starts and loads it."""
    from huggingface_hub import try_to_load_from_cache

    from ..models.arch import UnsupportedModel
    from ..models.support import check_model, read_model_config

    path = try_to_load_from_cache(repo.repo, "config.json", cache_dir=hub.cache_dir, revision=repo.commit)
    if not isinstance(path, str):
        return f"model.hubId {repo.repo}@{repo.commit[:12]} has no config.json: it is not a Hugging Face model folder"
    try:
        check_model(read_model_config(Path(path)), config)
    except UnsupportedModel as exc:
        return f"model.hubId {repo.repo}: {exc}"
    except (ValueError, TypeError, KeyError) as exc:
        return f"model.hubId {repo.repo}: its config.json cannot be read as a model's: {type(exc).__name__}: {exc}"
    return None


if __name__ == "__main__":
    sys.exit(main())
