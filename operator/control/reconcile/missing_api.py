"""The MissingAPI condition: a child's kind is not served by this cluster (its CRD is not installed). Pure.

Only the agent-sandbox kinds can be missing while the operator runs (it does not start without JobSet's
CRD): a job whose rollout.multiTurn.sandbox.backend is agentSandbox needs the kubernetes-sigs agent-sandbox
controller, which the cluster admin installs. The controller asks the API's discovery for each kind it is
about to write; with one missing it writes nothing and the job waits with this condition (Pending, if its
pods were about to be made), whose message names the kinds and what to install, and looks again every
RETRY_SECONDS (an installed CRD is found then: a discovery miss refreshes the client's cache). The condition
turns False once every kind is served.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Sequence

from ..sandbox_address import AGENT_SANDBOX_EXTENSIONS_API_VERSION
from .conditions import set_condition, set_phase
from .context import Decision

MISSING_API = "MissingAPI"
RETRY_SECONDS = 30.0
"""How soon a job waiting for a CRD looks again: no watch of ours sees a CRD arrive."""
AGENT_SANDBOX_VERSION = "v1.0.1"
"""The agent-sandbox release the cluster tier runs (scripts/agent-sandbox-binaries.sh)."""
AGENT_SANDBOX_GROUPS = ("agents.x-k8s.io", "extensions.agents.x-k8s.io")


def missing_message(missing: Sequence[tuple[str, str]]) -> str:
    """(apiVersion, kind) of each kind not served, in words, with what to do about it."""
    kinds = ", ".join(f"{kind} ({api_version})" for api_version, kind in missing)
    sentence = f"this cluster does not serve {kinds}: its CRD is not installed"
    if any(api_version.split("/")[0] in AGENT_SANDBOX_GROUPS for api_version, _ in missing):
        sentence += (
            f"; rollout.multiTurn.sandbox.backend agentSandbox needs the kubernetes-sigs agent-sandbox controller "
            f"with its extensions (tested: {AGENT_SANDBOX_VERSION}, run with --extensions, its CRDs including "
            f"{AGENT_SANDBOX_EXTENSIONS_API_VERSION} SandboxTemplate and SandboxWarmPool): ask the cluster admin "
            f"to install it, or set backend: pods"
        )
    return sentence + "; the job waits until then"


def with_missing_apis(decision: Decision, missing: Sequence[tuple[str, str]], now: datetime) -> Decision:
    """`decision` with nothing created, MissingAPI True and, for a job that was about to make its pods, the
    phase Pending with the same reason; with nothing missing, MissingAPI False where it was True."""
    status = decision.status.model_copy(deep=True)
    held = any(c.type == MISSING_API and c.status == "True" for c in decision.status.conditions)
    if not missing:
        if not held:
            return decision
        set_condition(status, MISSING_API, "False", "APIsServed", "", now)
        return dataclasses.replace(decision, status=status)
    message = missing_message(missing)
    set_condition(status, MISSING_API, "True", MISSING_API, message, now)
    if decision.create_jobset or decision.create_initializer:
        set_phase(status, "Pending", MISSING_API, message, now)
    events = decision.events if held else (*decision.events, ("Warning", MISSING_API, message[:1000]))
    return dataclasses.replace(
        decision, status=status, create_jobset=False, create_initializer=False, events=events, requeue_after=RETRY_SECONDS, message=message
    )
