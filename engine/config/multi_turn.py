"""Multi-turn rollouts: the tools a policy may call, and the bounds of one trajectory (rollout.multiTurn)."""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

from pydantic import Field
from pydantic.alias_generators import to_snake

from .algorithm import ENTRY_NAME
from .base import LocalPath, Rule, SpecModel, pattern

# The engine's built-in tools (kuberl.engine.agents registers them under these names); the names are
# part of the API, so they live here, as the reward rules' do.
BUILTIN_TOOLS = ("calculator", "python")
CODE_TOOLS = ("python",)
# Set by the operator in trainer pods, read where HTTP tools run (engine/agents/http_network.py): the
# networks HTTP tools may reach despite the refused ranges (the chart's tools.allowedNetworks), and the node's
# own address, which they refuse (its kubelet).
TOOL_NETWORKS_ENV = "KUBERL_TOOL_ALLOWED_NETWORKS"
NODE_IP_ENV = "KUBERL_NODE_IP"
SANDBOX_QUEUE_ENV = "KUBERL_SANDBOX_QUEUE_SECONDS"
"""How long a trainer's tool call waits for a free sandbox pod: the job's sandbox.queueSeconds, set by the operator."""
"""The built-ins whose calls run code (in the tool sandbox), as functions of a file do."""

_NAME = pattern(r"^[A-Za-z_][A-Za-z0-9_-]*$", "a tool name: letters, digits, '_' and '-', not starting with a digit or '-'")
_FUNCTION = pattern(r"^[A-Za-z_][A-Za-z0-9_]*$", "a Python function name")
_HTTP = pattern(r"^https?://[^\s]+$", "an http:// or https:// URL")
_BUILTIN_CEL = "[" + ", ".join(f"'{name}'" for name in BUILTIN_TOOLS) + "]"


class ToolSpec(SpecModel):
    """A tool the policy may call: a built-in (name calculator or python alone), a function of a
    Python file (path, function), or an HTTP endpoint (url; JSON arguments in, JSON out)."""

    name: str = Field(min_length=1, max_length=64, pattern=_NAME)
    """What the model calls it; calculator and python alone are the built-ins."""
    path: LocalPath | None = None
    """A local .py file with the tool's function; it runs in a sandboxed process of its own per call."""
    function: str | None = Field(default=None, min_length=1, max_length=256, pattern=_FUNCTION)
    """The function of path to call with the model's arguments (keyword arguments); it returns text. Default: name."""
    url: str | None = Field(default=None, min_length=8, max_length=2048, pattern=_HTTP)
    """An HTTP endpoint (e.g. a Service in the cluster): the arguments are POSTed as a JSON object, the
    JSON reply is the result."""
    timeout_seconds: float = Field(default=10.0, gt=0.0, le=600.0)
    """Wall-clock limit of one call; a call that takes longer is ended and answered with an error message.
    At most 10 minutes: a rollout waits for its slowest call."""
    description: str | None = Field(default=None, min_length=1, max_length=4096)
    """What the model is told the tool does; default: the built-in's own, the function's docstring, or the URL."""
    parameters: dict[str, Any] | None = Field(default=None, max_length=16)
    """The JSON schema of the arguments (an object schema); default: the built-in's own, or read
    from the function's signature; an HTTP tool without one takes any object."""
    memory_mb: int = Field(default=512, ge=128, le=65536)
    """Sandboxed tools (python and functions of a file): the address-space limit of the tool's process, in MiB."""
    max_output_bytes: int = Field(default=16384, ge=256, le=1 << 20)
    """The longest result, in bytes; a longer one is answered with an error message. At most 1 MiB: a
    result goes into the model's context."""

    RULES = (
        Rule(
            message=f"{' and '.join(BUILTIN_TOOLS)} are built-in tools: give them no path or url (name another tool of your own)",
            check=lambda s: s.name not in BUILTIN_TOOLS or (s.path is None and s.url is None),
            cel=f"!(self.name in {_BUILTIN_CEL}) || (!has(self.path) && !has(self.url))",
            field="name",
        ),
        Rule(
            message=f"a tool that is not built in ({', '.join(BUILTIN_TOOLS)}) needs exactly one of path (a Python file) and url (an HTTP endpoint)",
            check=lambda s: s.name in BUILTIN_TOOLS or (s.path is None) != (s.url is None),
            cel=f"self.name in {_BUILTIN_CEL} || has(self.path) != has(self.url)",
        ),
        Rule(
            message="function applies only to path",
            check=lambda s: s.function is None or s.path is not None,
            cel="!has(self.function) || has(self.path)",
            field="function",
        ),
        Rule(
            message="path must name a .py file",
            check=lambda s: s.path is None or s.path.endswith(".py"),
            cel="!has(self.path) || self.path.endsWith('.py')",
            field="path",
        ),
    )

    @property
    def kind(self) -> str:
        """builtin, function or http: which of the engine's tool kinds builds it."""
        return "http" if self.url is not None else "function" if self.path is not None else "builtin"

    @property
    def runs_code(self) -> bool:
        """Whether its calls run code in the tool sandbox (python, and functions of a file)."""
        return self.kind == "function" or (self.kind == "builtin" and self.name in CODE_TOOLS)


_QUANTITY = pattern(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[mkMGTPE])?$", "a Kubernetes quantity such as 500m, 2, 512Mi or 4Gi")
_SUBDOMAIN = pattern(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", "a DNS-1123 subdomain: lower-case letters, digits, '-' and '.'"
)


_IPV4_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4_CIDR = rf"^({_IPV4_OCTET}[.]){{3}}{_IPV4_OCTET}/(3[0-2]|[12]?[0-9])$"
"""CEL can say an IPv4 CIDR's grammar (the API server's CIDR functions need Kubernetes 1.31, the chart
supports 1.30); an IPv6 one is checked by our own parsing only."""
LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
"""Never reachable from a sandbox pod: a destination that covers them has them as exceptions."""
MAX_EGRESS_DESTINATIONS = 16
MAX_EGRESS_PORTS = 16


def _network(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The network `cidr` names exactly (no host bits set), else None."""
    if "/" not in cidr:
        return None
    try:
        return ipaddress.ip_network(cidr, strict=True)
    except ValueError:
        return None


class EgressPortSpec(SpecModel):
    """A port, or a range of ports, that a sandbox pod may connect to at a destination."""

    protocol: Literal["TCP", "UDP"] = "TCP"
    """TCP or UDP."""
    port: int = Field(ge=1, le=65535)
    """The port, or the first of a range."""
    end_port: int | None = Field(default=None, ge=1, le=65535)
    """The last port of a range port..endPort (inclusive)."""

    RULES = (
        Rule(
            message="endPort must be at least port",
            check=lambda s: s.end_port is None or s.end_port >= s.port,
            cel="!has(self.endPort) || self.endPort >= self.port",
            field="endPort",
        ),
    )


class EgressDestinationSpec(SpecModel):
    """A network the sandbox pods may reach (a NetworkPolicy ipBlock), on the ports given (every port
    when none is given)."""

    cidr: str = Field(
        min_length=4, max_length=43, pattern=pattern(r"^[0-9a-fA-F:.]+/[0-9]{1,3}$", "a CIDR such as 203.0.113.0/24 or 2001:db8::/32")
    )
    """The network, e.g. 203.0.113.0/24 or 203.0.113.7/32 for one address; link-local addresses
    (169.254.0.0/16, fe80::/10: the clouds' metadata servers) are always left out of it."""
    ports: list[EgressPortSpec] = Field(default=[], max_length=MAX_EGRESS_PORTS)
    """The ports it may reach there; none given: every port."""

    RULES = (
        Rule(
            message="cidr must be a network address and prefix length with no host bits set, e.g. 203.0.113.0/24 (not 203.0.113.7/24)",
            check=lambda s: _network(s.cidr) is not None,
            cel=f"self.cidr.contains(':') || self.cidr.matches('{_IPV4_CIDR}')",
            field="cidr",
            detail=lambda s: f"got {s.cidr!r}",
        ),
        Rule(
            message="cidr must not lie within the link-local networks 169.254.0.0/16 and fe80::/10 (the clouds' metadata servers)",
            check=lambda s: (n := _network(s.cidr)) is None or not any(n.version == ll.version and n.subnet_of(ll) for ll in LINK_LOCAL),
            cel="!self.cidr.startsWith('169.254.')",
            field="cidr",
        ),
    )

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        network = _network(self.cidr)
        assert network is not None  # the rule above
        return network


class ToolSandboxSpec(SpecModel):
    """On a cluster, the python and function tools of a job run in sandbox pods of the job, outside
    the trainer pods: no ServiceAccount token, none of the trainer's environment, secrets or volumes,
    a read-only root with an emptyDir scratch, no egress. Under `kuberl run` this section changes nothing."""

    backend: Literal["pods", "agentSandbox"] = "pods"
    """Who keeps the sandbox pods running. pods: a Deployment of the job. agentSandbox: the
    kubernetes-sigs agent-sandbox controller (v1.0, extensions on), which the cluster admin installs:
    a SandboxTemplate of the same pod and a SandboxWarmPool of `replicas` sandboxes from it. Either
    way the pods are the same, behind the same headless Service and NetworkPolicy."""
    pods: bool = True
    """Run the tool calls in sandbox pods (the default whenever the job has a python or function tool).
    false: in the trainer pod itself, under bubblewrap where the pod allows user namespaces, else only
    with allowUnisolatedTools."""
    replicas: int = Field(default=2, ge=1, le=256)
    """Sandbox pods; each runs one call at a time (a call waits for a free one)."""
    queue_seconds: int = Field(default=300, ge=1, le=3600)
    """How long a call waits for a free sandbox pod (all busy, or none ready yet); past it, the call
    fails with an error message the model reads and the run goes on. The tool's timeoutSeconds starts
    when a pod takes the call, so a call can take up to queueSeconds plus timeoutSeconds."""
    runtime_class_name: str | None = Field(default=None, min_length=1, max_length=253, pattern=_SUBDOMAIN)
    """The sandbox pods' RuntimeClass, e.g. gVisor's (one the chart allows: admission.allowedRuntimeClasses)."""
    cpu: str = Field(default="500m", min_length=1, max_length=32, pattern=_QUANTITY)
    """CPU of each sandbox pod (request and limit): one call at a time, mostly idle between calls."""
    memory: str = Field(default="1Gi", min_length=1, max_length=32, pattern=_QUANTITY)
    """Memory of each sandbox pod (request and limit): more than the tools' memoryMb."""
    scratch_size: str = Field(default="1Gi", min_length=1, max_length=32, pattern=_QUANTITY)
    """The size limit of each sandbox pod's scratch volume (an emptyDir, emptied after every call)."""
    egress: list[EgressDestinationSpec] = Field(default=[], max_length=MAX_EGRESS_DESTINATIONS)
    """The networks the tool code may reach from the sandbox pods; none by default (no egress at all).
    Only networks the chart's admission.allowedSandboxEgress lists, as written there. Names are not
    resolved unless dns is true as well."""
    dns: bool = False
    """Let the sandbox pods ask the cluster's DNS (kube-dns pods of kube-system, port 53): off by default
    because a resolver that recurses is a way out for data by itself, whatever egress says. Needs the
    chart's admission.allowSandboxDNS."""

    RULES = (
        Rule(
            message="backend agentSandbox runs the tool calls in sandbox pods: it needs pods true",
            check=lambda s: s.backend != "agentSandbox" or s.pods,
            cel="!has(self.backend) || self.backend != 'agentSandbox' || !has(self.pods) || self.pods",
            field="backend",
        ),
    )


class MultiTurnSpec(SpecModel):
    """Trajectories of several turns: the policy writes, calls tools, reads their results and goes on;
    it is trained on its own tokens only (tool results and template tokens are masked out)."""

    max_turns: int = Field(default=4, ge=1, le=64)
    """The policy's turns per trajectory; the environment still answers the last one (its reward
    counts), but nothing is appended after it."""
    max_tool_calls_per_turn: int = Field(default=4, ge=1, le=64)
    """Tool calls run per turn; the calls past this get an error message."""
    max_total_tokens: int = Field(default=1024, ge=1, le=1_048_576)
    """Tokens of a trajectory after its prompt, the policy's and the tool results' together (the
    longest sequence the trainer sees is maxPromptLength plus this)."""
    tools: list[ToolSpec] = Field(default=[], max_length=32)
    """The tools, described to the model through the chat template."""
    parser: str = Field(default="hermes", min_length=1, max_length=64, pattern=ENTRY_NAME)
    """How tool calls are read from the policy's text (a registered parser; hermes: <tool_call>{json}</tool_call>)."""
    environment: str = Field(default="tools", min_length=1, max_length=64, pattern=ENTRY_NAME)
    """The registered environment that answers each turn (tools: runs the turn's tool calls); a
    plug-in file of algorithm.plugins may register its own."""
    environment_options: dict[str, Any] = Field(default={}, max_length=32)
    """Keyword options of the environment, by their camelCase names."""
    allow_unisolated_tools: bool = False
    """Where the trainer cannot sandbox the python and function tools behind a kernel boundary
    (bubblewrap needs user namespaces, which a pod under the runtime's default seccomp profile
    lacks), run them anyway in plain child processes of the trainer: the model's code can then read
    what the trainer can (its files, its ServiceAccount token) and reach what it can. Only for tools
    and models you trust; without it such a job does not start there."""
    sandbox: ToolSandboxSpec = ToolSandboxSpec()
    """Where the python and function tools run on a cluster: sandbox pods of the job (the default)."""

    RULES = (
        Rule(
            message="each tool name may appear once",
            check=lambda s: len({t.name for t in s.tools}) == len(s.tools),
            cel="self.tools.all(t, self.tools.filter(x, x.name == t.name).size() == 1)",
            field="tools",
            detail=lambda s: "repeated: " + ", ".join(sorted({t.name for t in s.tools if sum(x.name == t.name for x in s.tools) > 1})),
        ),
        Rule(
            message="the tools environment needs at least one tool",
            check=lambda s: s.environment != "tools" or bool(s.tools),
            cel="self.environment != 'tools' || self.tools.size() > 0",
            field="tools",
        ),
    )

    @property
    def environment_kwargs(self) -> dict[str, Any]:
        """environmentOptions as the factory's keyword arguments (snake_case)."""
        return {to_snake(key): value for key, value in self.environment_options.items()}
