"""Which sandbox backend runs this process's tool calls, chosen once at the start of a run.

On a cluster, where the operator gives the trainer pods KUBERL_SANDBOX_URL, the job's sandbox pods
(sandbox_pod.py): tool code never runs in the trainer's pod. Elsewhere, bubblewrap when a probe
call works here; otherwise a job with python or function tools does not
start, unless it sets rollout.multiTurn.allowUnisolatedTools, which runs them in plain child
processes (the process backend). The choice is logged once.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from . import sandbox_bwrap as _bwrap  # noqa: F401  (registers the backends)
from . import sandbox_pod as _pod  # noqa: F401
from . import sandbox_process as _process  # noqa: F401
from .sandbox import SANDBOX_BACKENDS, Limits, Outcome, SandboxBackend
from .sandbox_protocol import SANDBOX_URL_ENV

log = logging.getLogger("kuberl.engine")
ISOLATED = "bubblewrap"
UNISOLATED = "process"
REMOTE = "pod"


class IsolationUnavailable(RuntimeError):
    """Tools that need a sandbox, on a machine without one, in a job that did not allow running them unisolated."""


@dataclass(frozen=True)
class Choice:
    backend: str | None
    """The backend's name; None: the job cannot run its tools here."""
    message: str
    """For the log, or the error a job that cannot start gets."""


def decide(problem: str | None, allow_unisolated: bool) -> Choice:
    """The backend, given why bubblewrap does not work here (None: it does)."""
    if problem is None:
        return Choice(ISOLATED, "tool calls run under bubblewrap (a kernel boundary)")
    if allow_unisolated:
        return Choice(
            UNISOLATED,
            f"tool calls run UNISOLATED, in plain child processes (allowUnisolatedTools is set; bubblewrap does not work here: {problem})",
        )
    return Choice(
        None,
        "rollout.multiTurn.tools: the python and function tools run the model's and your code behind a "
        f"kernel boundary (bubblewrap), which does not work here: {problem}. Run the job where user "
        "namespaces are allowed (docs/agents.md: a RuntimeClass such as gVisor, or a pod that allows "
        "user namespaces), or set rollout.multiTurn.allowUnisolatedTools: true to run them in plain "
        "child processes that can read what the trainer can (only for code you trust)",
    )


def decide_remote(url: str, problem: str | None) -> Choice:
    """The job's sandbox pods at `url`, given why they do not answer (None: they do)."""
    if problem is None:
        return Choice(REMOTE, f"tool calls run in the job's sandbox pods ({url})")
    return Choice(
        None,
        f"rollout.multiTurn.tools: the python and function tools run in the job's sandbox pods "
        f"({url}), which did not answer: {problem}. See them with kubectl get pods -l "
        "kuberl.dev/sandbox=<job> and kubectl describe (a RuntimeClass that does not exist, too little "
        "CPU or memory for them, an image that cannot be pulled)",
    )


_lock = threading.Lock()
_probed: dict[str, str | None] = {}
_active: SandboxBackend | None = None


def probe(name: str = ISOLATED) -> str | None:
    """Why backend `name` does not work here (None: it does); probed once per process."""
    with _lock:
        if name not in _probed:
            _probed[name] = SANDBOX_BACKENDS[name]().probe()
        return _probed[name]


def choose_sandbox(allow_unisolated: bool = False) -> SandboxBackend:
    """The backend of this run's tool calls (probing and logging on the first call); raises
    IsolationUnavailable with what to do when there is none."""
    global _active
    url = os.environ.get(SANDBOX_URL_ENV)
    choice = decide_remote(url, probe(REMOTE)) if url else decide(probe(ISOLATED), allow_unisolated)
    if choice.backend is None:
        raise IsolationUnavailable(choice.message)
    with _lock:
        if _active is None or _active.name != choice.backend:
            _active = SANDBOX_BACKENDS[choice.backend]()
            log.log(logging.INFO if _active.isolated else logging.WARNING, "%s: %s", choice.message, _active.description)
        return _active


def run_in_sandbox(request: dict[str, Any], limits: Limits) -> Outcome:
    """Run one request (sandbox_child.py's modes) with this run's backend (bubblewrap, unless the
    run chose otherwise at its start)."""
    return (_active or choose_sandbox()).run(request, limits)
