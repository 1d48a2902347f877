"""The client's errors: one class per thing a user can do something about, each with a one-line message."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kuberl.operator.validation.problems import Problem


class ClientError(Exception):
    """Anything the client could not do; str() is one line that says why (and, where it can, what to do)."""


class ConfigError(ClientError):
    """No usable kubeconfig, or no such context in it."""


class NoKubeconfigError(ConfigError):
    """No kubeconfig anywhere (no --kubeconfig, no $KUBECONFIG, no ~/.kube/config) and not in a pod: no cluster at all."""


class UnreachableError(ClientError):
    """The API server did not answer."""


class CRDNotInstalledError(ClientError):
    """The cluster has no RLJob CustomResourceDefinition."""


class ForbiddenError(ClientError):
    """RBAC refused the request (HTTP 403)."""


class NotFoundError(ClientError):
    """No such RLJob (or namespace, or pod of the job)."""


class InvalidJobError(ClientError):
    """A manifest that the parser, the cluster rules or the API server refuses; `problems` lists every reason."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]


class ImmutableFieldsError(InvalidJobError):
    """An update of a live RLJob that changes more than spec.runPolicy."""


class WaitTimeoutError(ClientError):
    """`wait` ran out of time."""


class PhaseError(ClientError):
    """`wait` saw the job end in another terminal phase than the one waited for."""


def problems_error(problems: list[Problem]) -> InvalidJobError:
    lines = [str(p) for p in problems]
    return InvalidJobError(lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""), lines)


# --- the API server's answers -----------------------------------------------------------------------

_REFUSED = re.compile(
    r'User "(?P<user>[^"]*)" cannot (?P<verb>\w+) resource "(?P<resource>[^"]+)"'
    r'(?: in API group "[^"]*")?(?: in the namespace "(?P<namespace>[^"]*)")?'
)


def api_status(body: object) -> dict:
    """The metav1.Status of an error response, or {} when the body is not one (a plain "404 page not found")."""
    if not isinstance(body, (str, bytes)):
        return {}
    try:
        status = json.loads(body)
    except ValueError:
        return {}
    return status if isinstance(status, dict) and status.get("kind") == "Status" else {}


def forbidden(body: object, verb: str, resource: str, namespace: str | None) -> ForbiddenError:
    """What RBAC refused, in the server's own terms where it says them; namespace None: a request across all namespaces."""
    message = api_status(body).get("message", "")
    found = _REFUSED.search(message)
    user = ""
    if found:
        verb, resource = found["verb"], found["resource"]
        namespace = found["namespace"] or namespace
        user = f" (user {found['user']})"
    if namespace is None:
        return ForbiddenError(
            f"your user may not {verb} {resource} across all namespaces{user}: ask your cluster admin for a "
            "ClusterRole that grants it, or name a namespace (-n)"
        )
    return ForbiddenError(
        f"your user may not {verb} {resource} in namespace {namespace}{user}: ask your cluster admin for a Role that grants it"
    )
