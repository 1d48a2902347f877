"""Choosing the tool sandbox: bubblewrap where it works, a clear refusal where it does not (unless
the job allows unisolated tools), one log line saying which; the bwrap command line and the
seccomp filter that make the boundary."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kuberl.engine.agents import build_tools
from kuberl.engine.agents import isolation
from kuberl.engine.agents.sandbox import Limits
from kuberl.engine.agents.sandbox_bwrap import CHILD_INSIDE, ETC_FILES, TOP_LEVEL, BubblewrapBackend, bwrap_argv, pids_cgroup, runtime_paths
from kuberl.engine.agents.sandbox_seccomp import compile_filter, rules
from kuberl.engine.agents.tools import ToolError
from kuberl.engine.config.multi_turn import MultiTurnSpec, ToolSpec

from .bubblewrap import requires_bubblewrap

bwrap_works = requires_bubblewrap


@pytest.fixture
def without_bubblewrap(monkeypatch):
    """This process as on a machine where bubblewrap fails (its probe's answer, as a real failed
    probe gives it), with no backend chosen yet; restored after."""
    failed = BubblewrapBackend(bwrap="/nonexistent/bwrap").probe()
    assert failed == "/nonexistent/bwrap is not installed (the bubblewrap package: apt-get install bubblewrap)"
    monkeypatch.setattr(isolation, "_probed", {isolation.ISOLATED: failed})
    monkeypatch.setattr(isolation, "_active", None)
    return failed


def test_the_decision() -> None:
    assert isolation.decide(None, False).backend == "bubblewrap"
    assert isolation.decide(None, True).backend == "bubblewrap"  # the field only matters where bubblewrap fails
    refused = isolation.decide("no user namespaces", False)
    assert refused.backend is None and "no user namespaces" in refused.message
    assert "allowUnisolatedTools: true" in refused.message and "docs/agents.md" in refused.message
    assert isolation.decide("no user namespaces", True).backend == "process"


def test_code_tools_do_not_start_without_isolation(without_bubblewrap: str, tmp_path: Path) -> None:
    with pytest.raises(ToolError) as refused:
        build_tools([ToolSpec(name="python")])
    message = str(refused.value)
    assert message.startswith("rollout.multiTurn.tools: ") and "allowUnisolatedTools" in message
    assert "nonexistent" in message  # why bubblewrap does not work here
    tool = tmp_path / "tool.py"
    tool.write_text("def f() -> str:\n    return 'x'\n")
    with pytest.raises(ToolError, match="allowUnisolatedTools"):
        build_tools([ToolSpec(name="f", path=str(tool))])
    # Tools that run no code need no sandbox.
    assert set(build_tools([ToolSpec(name="calculator")])) == {"calculator"}


def test_allow_unisolated_tools_runs_them_in_plain_processes(without_bubblewrap: str, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="kuberl.engine"):
        [python] = build_tools([ToolSpec(name="python", timeout_seconds=10)], allow_unisolated=True).values()
        build_tools([ToolSpec(name="python")], allow_unisolated=True)
        assert python.call({"code": "print(6 * 7)"}).text == "42\n"
    said = [r for r in caplog.records if "UNISOLATED" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING  # once per run
    assert "allowUnisolatedTools" in said[0].getMessage() and "nonexistent" in said[0].getMessage()


@bwrap_works
def test_the_run_logs_its_isolation_once(monkeypatch, caplog) -> None:
    monkeypatch.setattr(isolation, "_active", None)
    with caplog.at_level(logging.INFO, logger="kuberl.engine"):
        build_tools([ToolSpec(name="python")])
        build_tools([ToolSpec(name="python")], allow_unisolated=True)
    said = [r.getMessage() for r in caplog.records if "bubblewrap" in r.getMessage()]
    assert len(said) == 1 and "a kernel boundary" in said[0] and "seccomp" in said[0]


def test_the_field_is_part_of_the_spec() -> None:
    spec = MultiTurnSpec.model_validate({"tools": [{"name": "python"}], "allowUnisolatedTools": True})
    assert spec.allow_unisolated_tools is True
    assert MultiTurnSpec.model_validate({"tools": [{"name": "python"}]}).allow_unisolated_tools is False


def test_the_bwrap_command_shows_only_the_runtime() -> None:
    argv = bwrap_argv("bwrap", seccomp_fd=9, passwd_fd=7, group_fd=8, limits=Limits(timeout=1.0, scratch_mb=16))
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--clearenv", "--remount-ro"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL" and argv[argv.index("--seccomp") + 1] == "9"
    assert "--share-net" not in argv and "--bind" not in argv and "--dev-bind" not in argv  # nothing writable of the host
    binds = {argv[i + 2] for i, a in enumerate(argv) if a in ("--ro-bind", "--ro-bind-try")}
    runtime = {"/usr", CHILD_INSIDE, *(f"/etc/{n}" for n in ETC_FILES), *(f"/{n}" for n in TOP_LEVEL), *runtime_paths()}
    assert binds <= runtime, binds - runtime
    for private in ("/var/run/secrets", "/run/secrets", "/etc/kuberl", "/etc/shadow"):
        assert not any(b == private or b.startswith(private + "/") for b in binds), private
    assert not binds & {"/", "/etc", "/tmp", "/var", "/root", os.getcwd(), str(Path.home())}  # no whole tree of the trainer's
    assert argv[argv.index("--tmpfs") - 1] == str(16 << 20)  # the scratch folder is bounded
    scratch = argv.index("--tmpfs")
    assert all(argv.index(path) > scratch for path in runtime_paths())  # bound over the scratch, not hidden under it


@bwrap_works
def test_an_interpreter_under_the_scratch_folders_path_still_runs(tmp_path: Path, monkeypatch) -> None:
    """A virtual environment under /tmp (where a CI checkout may lie) is the sandbox's runtime too, although the
    sandbox's scratch is a tmpfs at /tmp: every call failed with "execvp ...: No such file or directory" when
    the scratch was mounted over it."""
    import subprocess
    import sys

    assert str(tmp_path).startswith("/tmp/")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python"))
    monkeypatch.setattr(sys, "prefix", str(venv))
    outcome = BubblewrapBackend().run({"mode": "python", "code": "import sys; print(sys.prefix)"}, Limits(timeout=30.0))
    assert outcome.output.decode().strip() == str(venv), (outcome.output, outcome.death())


def test_the_seccomp_filter_compiles() -> None:
    bpf = compile_filter()
    assert len(bpf) % 8 == 0 and len(bpf) // 8 > len(rules())  # a BPF program of 8-byte instructions, a test per rule at least
    assert {"ptrace", "unshare", "setns", "mount", "bpf", "io_uring_setup", "keyctl"} <= {r.syscall for r in rules()}


def test_no_pids_cgroup_where_none_can_be_made(tmp_path: Path) -> None:
    assert pids_cgroup(8, (str(tmp_path / "absent"), str(tmp_path))) is None
    assert list(tmp_path.iterdir()) == []


@bwrap_works
def test_the_kernel_refuses_network_and_namespaces_with_the_hook_off() -> None:
    """The seccomp filter at work: an Internet socket and a new user namespace are refused even
    before the network namespace would have mattered; a Unix socket pair works."""
    code = (
        "import ctypes, socket\ntry: socket.socket(); print('inet ok')\nexcept OSError as e: print('inet', e.errno)\n"
        "a, b = socket.socketpair(); a.send(b'x'); print('unix', b.recv(1))\n"
        "print('unshare', ctypes.CDLL(None, use_errno=True).unshare(0x10000000), ctypes.get_errno())"
    )
    out = BubblewrapBackend().run({"mode": "python", "code": code, "audit_hook": False}, Limits(timeout=10.0)).output.decode()
    assert "inet 1\n" in out and "unix b'x'" in out and "unshare -1 1" in out, out


def test_a_failed_probe_says_what_bubblewrap_said(tmp_path: Path) -> None:
    """bwrap where the kernel refuses it a user namespace (as in a pod under the default seccomp
    profile) prints why and exits: the probe's answer is that line."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert BubblewrapBackend(bwrap=str(fake)).probe() == "bwrap: No permissions to create new namespace"
