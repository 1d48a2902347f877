"""Where an HTTP tool may connect, attacked: loopback, a name that resolves to loopback, metadata
addresses, the API server, redirects to another origin, a DNS answer that changes between check and
connect. All traffic stays on loopback: refused addresses are refused before any packet is sent."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kuberl.engine.agents.http_network import (
    ALLOWED_NETWORKS_ENV,
    NetworkPolicy,
    NetworkSettingError,
    address_refusal,
    parse_allowed_networks,
    policy_from_environment,
)
from kuberl.engine.agents.http_tool import MAX_REDIRECTS, HttpTool
from kuberl.engine.config.multi_turn import ToolSpec

LOOPBACK = NetworkPolicy(allowed=parse_allowed_networks("127.0.0.0/8"))
ip = ipaddress.ip_address


@pytest.mark.parametrize(
    ("address", "allowed", "cluster_api", "refusal"),
    [
        ("127.0.0.1", "", "", "a loopback address"),
        ("127.8.9.10", "", "", "a loopback address"),
        ("::1", "", "", "a loopback address"),
        ("::ffff:127.0.0.1", "", "", "a loopback address"),  # IPv4-mapped IPv6 reaches 127.0.0.1
        ("169.254.169.254", "", "", "a cloud metadata address"),
        ("fd00:ec2::254", "", "", "a cloud metadata address"),
        ("100.100.100.200", "", "", "a cloud metadata address"),
        ("169.254.10.1", "", "", "a link-local address"),
        ("fe80::1", "", "", "a link-local address"),
        ("0.0.0.0", "", "", "an unspecified address"),
        ("::", "", "", "an unspecified address"),
        ("10.96.0.1", "", "10.96.0.1", "the cluster's API server"),
        ("10.96.0.2", "", "10.96.0.1", None),  # a Service beside it
        ("10.244.1.7", "", "", None),  # a pod
        ("93.184.216.34", "", "", None),  # the internet (egress is the NetworkPolicy's job)
        ("2001:db8::1", "", "", None),
        ("127.0.0.1", "127.0.0.0/8", "", None),  # the allow-list re-allows
        ("169.254.169.254", "169.254.169.254/32", "", None),
        ("10.96.0.1", "10.96.0.0/12", "10.96.0.1", None),
        ("127.0.0.1", "10.0.0.0/8, ::1/128", "", "a loopback address"),  # allow-listing ::1 is not 127.0.0.1
    ],
)
def test_which_addresses_a_tool_may_reach(address: str, allowed: str, cluster_api: str, refusal: str | None) -> None:
    assert address_refusal(ip(address), parse_allowed_networks(allowed), {ip(cluster_api)} if cluster_api else ()) == refusal


def test_a_bad_allow_list_names_the_variable_and_the_entry() -> None:
    with pytest.raises(NetworkSettingError, match=f"{ALLOWED_NETWORKS_ENV}: 'loopback' is not a network"):
        parse_allowed_networks("10.0.0.0/8,loopback")


def test_the_api_server_and_the_node_of_the_environment_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERL_NODE_IP", "192.168.7.20")
    monkeypatch.delenv(ALLOWED_NETWORKS_ENV, raising=False)
    assert policy_from_environment().refusal(ip("10.96.0.1")) == "the cluster's API server"
    assert policy_from_environment().refusal(ip("192.168.7.20")) == "the node's own address (its kubelet)"
    assert policy_from_environment().refusal(ip("192.168.7.21")) is None
    monkeypatch.setenv(ALLOWED_NETWORKS_ENV, "10.96.0.1/32")
    assert policy_from_environment().refusal(ip("10.96.0.1")) is None


class _Server:
    """A loopback HTTP server that records the paths it was asked for and answers from `routes`:
    path -> (status, headers, body)."""

    def __init__(self, routes: dict[str, tuple[int, dict[str, str], bytes]]):
        hits = self.hits = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                hits.append((self.command, self.path))
                status, headers, body = routes.get(self.path, (200, {}, json.dumps({"path": self.path}).encode()))
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value.format(port=self.server.server_address[1]))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._answer()

            do_GET = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    started: list[_Server] = []

    def start(routes=None) -> _Server:
        started.append(_Server(routes or {}))
        return started[-1]

    yield start
    for server in started:
        server.close()


def _tool(url: str, network: NetworkPolicy | None = None) -> HttpTool:
    return HttpTool(ToolSpec(name="t", url=url, timeout_seconds=3), network)


def test_a_loopback_url_is_refused_before_anything_is_sent(servers, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOWED_NETWORKS_ENV, raising=False)
    server = servers()
    result = _tool(f"http://127.0.0.1:{server.port}/x").call({})
    assert result.error and "127.0.0.1 is a loopback address, which tools may not call" in result.text, result.text
    assert "tools.allowedNetworks" in result.text and server.hits == []
    # Allow-listed, the same call goes through: the refusal was the address, not the server.
    monkeypatch.setenv(ALLOWED_NETWORKS_ENV, "127.0.0.0/8")
    assert json.loads(_tool(f"http://127.0.0.1:{server.port}/x").call({}).text) == {"path": "/x"}


def test_a_hostname_that_resolves_to_loopback_is_refused(servers) -> None:
    server = servers()
    result = _tool(f"http://localhost:{server.port}/", NetworkPolicy()).call({})
    assert result.error and "localhost resolves to" in result.text and "a loopback address" in result.text, result.text
    assert server.hits == []


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/",
        "http://100.100.100.200/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/",
    ],
)
def test_a_metadata_address_is_refused(url: str) -> None:
    started = time.monotonic()
    result = _tool(url, NetworkPolicy()).call({})
    assert result.error and "a cloud metadata address, which tools may not call" in result.text, result.text
    assert time.monotonic() - started < 1  # refused before connecting, not timed out


def test_a_redirect_to_another_origin_is_refused(servers) -> None:
    elsewhere = servers()
    redirector = servers({"/": (307, {"Location": f"http://127.0.0.1:{elsewhere.port}/steal"}, b"")})
    result = _tool(f"http://127.0.0.1:{redirector.port}/", LOOPBACK).call({"secret": 1})
    assert result.error and "redirected to another origin" in result.text, result.text
    assert redirector.hits == [("POST", "/")] and elsewhere.hits == []


def test_same_origin_redirects_are_followed_and_bounded(servers) -> None:
    server = servers(
        {
            "/old": (308, {"Location": "/new"}, b""),
            "/see": (303, {"Location": "http://127.0.0.1:{port}/done"}, b""),
            "/loop": (302, {"Location": "/loop"}, b""),
        }
    )
    assert json.loads(_tool(f"http://127.0.0.1:{server.port}/old", LOOPBACK).call({}).text) == {"path": "/new"}
    assert json.loads(_tool(f"http://127.0.0.1:{server.port}/see", LOOPBACK).call({}).text) == {"path": "/done"}
    assert server.hits == [("POST", "/old"), ("POST", "/new"), ("POST", "/see"), ("GET", "/done")]
    looped = _tool(f"http://127.0.0.1:{server.port}/loop", LOOPBACK).call({})
    assert looped.error and f"redirected more than {MAX_REDIRECTS} times" in looped.text


def test_the_connection_goes_to_the_address_that_was_checked(servers, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebinding DNS server answers an allowed address to the check and a metadata address after:
    the name is resolved once, and the socket connects to the address that passed."""
    server = servers()
    real, asked = socket.getaddrinfo, []

    def rebinding(host, port, *args, **kwargs):
        if host != "rebind.test":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        answer = "127.0.0.1" if len(asked) == 1 else "169.254.169.254"
        return real(answer, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    result = _tool(f"http://rebind.test:{server.port}/r", LOOPBACK).call({})
    assert json.loads(result.text) == {"path": "/r"} and asked == ["rebind.test"]


def test_the_charts_networks_reach_the_tools_of_the_planned_pods(monkeypatch) -> None:
    """The operator's settings (the chart's tools.allowedNetworks) become the actor pods' environment, which the
    tools read: the contract between the planner and the engine, crossed."""
    from kuberl.operator.control.children import OperatorSettings
    from kuberl.operator.validation.manifest import load_rljobs
    from kuberl.operator.control.planner import plan

    job = load_rljobs(Path(__file__).parents[2] / "examples" / "grpo-cluster" / "rljob.yaml")[0]
    job.metadata.namespace = "rl"
    settings = OperatorSettings(default_image="registry.example.com/kuberl-trainer:0.1.0", tool_networks=("10.20.0.0/16",))
    [actor] = [r for r in plan(job, uid="u", settings=settings).jobset["spec"]["replicatedJobs"] if r["name"] == "actor"]
    env = {e["name"]: e.get("value") for e in actor["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    monkeypatch.setenv(ALLOWED_NETWORKS_ENV, env[ALLOWED_NETWORKS_ENV])
    policy = policy_from_environment()
    assert policy.refusal(ipaddress.ip_address("10.20.3.4")) is None
    assert policy.refusal(ipaddress.ip_address("10.21.0.1")) is None  # a private address is not refused by itself
    assert policy.refusal(ipaddress.ip_address("127.0.0.1")) is not None
    without = plan(job, uid="u", settings=OperatorSettings(default_image="registry.example.com/kuberl-trainer:0.1.0"))
    assert ALLOWED_NETWORKS_ENV not in json.dumps(without.jobset)
