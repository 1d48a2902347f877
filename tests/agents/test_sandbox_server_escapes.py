"""The escape corpus (escape_cases.py) sent through sandbox servers (`kuberl sandbox-serve`, real
processes on loopback) by the pod backend, as a trainer sends its calls to the job's sandbox pods.

The arena and the checks are test_sandbox_escapes.py's, unchanged: the test is the trainer (its
files, sockets, signals, environment, victim process). The servers are started from the arena, with
the trainer's secret in their environment, so a call that reached a server's environment or working
folder is caught too. On this machine each server runs its calls under bubblewrap (its best
backend here); in a pod without user namespaces the pod is the boundary instead. The server's own
view is checked as well: every server still serves, nothing runs below any of them, and their scratch
folders are empty. A control run through a server with the plain process backend (no boundary on
this machine) shows that the checks see escapes through this path.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest


from .bubblewrap import requires_bubblewrap
from .escape_cases import CASES
from .sandbox_servers import Server, Servers, descendants, start_server
from .test_sandbox_escapes import CONFIGURATIONS, CONTROL, LIMITS, X86_ONLY, Arena, arena, run_corpus  # noqa: F401

REPLICAS = 4
pytestmark = requires_bubblewrap


@pytest.fixture(scope="module")
def servers(arena: Arena, tmp_path_factory) -> list[Server]:
    root = tmp_path_factory.mktemp("sandbox-servers")
    started: list[Server] = []
    try:
        for i in range(REPLICAS):
            started.append(start_server(root / f"scratch-{i}", backend="bubblewrap", cwd=arena.root, env=dict(os.environ)))
        assert os.environ["KUBERL_ESCAPE_SECRET"] == arena.secret  # the servers hold the trainer's secret
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def corpus(arena: Arena, servers: list[Server]):
    backend = Servers(servers)
    cases = tuple(c for c in CASES if platform.machine() == "x86_64" or c.name not in X86_ONLY)
    return {config: run_corpus(arena, backend, config, hook, cases) for config, hook in CONFIGURATIONS.items()}


@pytest.mark.parametrize("config", list(CONFIGURATIONS))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_no_escape_through_the_server(corpus, case, config: str) -> None:
    if case.name not in corpus[config]:
        pytest.skip(f"{case.name} uses x86-64 system-call numbers")
    outcome, found = corpus[config][case.name]
    assert outcome.error is None, f"{case.name}: the call did not reach a server: {outcome.error}"
    assert not found, f"{case.name} escaped ({config}): {found}; it printed {outcome.output[:500]!r}"


def test_the_servers_survive_the_corpus_with_nothing_left_below_them(corpus, servers: list[Server], arena: Arena) -> None:
    assert arena.victim.poll() is None and not arena.signals
    for server in servers:
        assert server.proc.poll() is None, "a sandbox server was killed"
        assert descendants(server.proc.pid) == []
        assert [p.name for p in Path(server.scratch).iterdir()] == []
        ok = Servers([server]).run({"mode": "python", "code": "print(6 * 7)"}, LIMITS)
        assert ok.output == b"42\n" and ok.reply.get("ok"), ok


def test_the_checks_see_escapes_through_a_server_without_a_boundary(arena: Arena, tmp_path: Path) -> None:
    unisolated = start_server(tmp_path / "scratch", backend="process", cwd=arena.root, env=dict(os.environ))
    try:
        cases = tuple(c for c in CASES if c.name in CONTROL)
        results = run_corpus(arena, Servers([unisolated]), "server-control", False, cases)
    finally:
        unisolated.stop()
    escaped = {name for name, (_, found) in results.items() if found}
    assert escaped == set(CONTROL), {name: (o.output[:300], f) for name, (o, f) in results.items()}
