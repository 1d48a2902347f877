"""The sandbox pods' protocol and the server's sweep, as pure parts: what a request may carry, how big a
reply can be, and which processes the sweep takes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kuberl.engine.agents.sandbox import Limits, Outcome
from kuberl.engine.agents.sandbox_protocol import CallReply, CallRequest, WireRequest, reply_limit
from kuberl.engine.agents.sandbox_sweep import targets


@pytest.mark.parametrize("key", ["scratch", "reply_fd", "isolation", "memory_mb", "processes", "file_bytes"])
def test_a_request_cannot_set_what_the_server_sets(key: str) -> None:
    with pytest.raises(ValidationError, match=key):
        WireRequest.model_validate({"mode": "python", "code": "1", key: 3})


def test_each_mode_needs_its_fields() -> None:
    with pytest.raises(ValidationError, match="needs code"):
        WireRequest.model_validate({"mode": "python"})
    with pytest.raises(ValidationError, match="needs source, path, function"):
        WireRequest.model_validate({"mode": "function"})
    assert WireRequest.model_validate({"mode": "function", "source": "", "path": "f.py", "function": "f"}).arguments == {}
    with pytest.raises(ValidationError, match="limits.timeout"):
        CallRequest.model_validate({"request": {"mode": "python", "code": "1"}, "limits": {"timeout": 0}})


def test_the_largest_honest_reply_fits_the_clients_bound() -> None:
    limits = Limits(timeout=5.0, max_output_bytes=1 << 20)
    worst_text = "\x01" * (limits.file_bytes // 2)  # escaped as \u0001: 6 bytes each
    outcome = Outcome({"text": worst_text, "isolation": "process"}, b"\xff" * (limits.max_output_bytes + 1), 1 << 30, 0)
    size = len(CallReply.of(outcome, "process").model_dump_json(by_alias=True))
    assert size <= reply_limit(limits)
    back = CallReply.model_validate_json(CallReply.of(outcome, "process").model_dump_json(by_alias=True)).outcome(limits)
    assert back.output == outcome.output and back.reply == outcome.reply


def test_the_sweep_takes_the_whole_namespace_as_its_init_else_only_its_tree() -> None:
    table = {1: (0, "S"), 10: (1, "S"), 11: (10, "S"), 12: (11, "Z"), 20: (1, "S"), 30: (5, "S")}
    assert targets(table, 1, whole_namespace=True) == {10, 11, 12, 20, 30}
    assert targets(table, 10, whole_namespace=False) == {11, 12}
    assert targets(table, 20, whole_namespace=False) == set()


def test_the_server_describes_a_plain_process_as_the_pod_bounds_it() -> None:
    # The process backend's own description is the trainer's view ("allowUnisolatedTools ... no kernel boundary
    # between the tools and the trainer"); a sandbox pod's log must not say that of itself.
    from kuberl.engine.agents.sandbox import SANDBOX_BACKENDS
    from kuberl.engine.agents.sandbox_server import described

    plain, bwrap = SANDBOX_BACKENDS["process"](), SANDBOX_BACKENDS["bubblewrap"]()
    assert "allowUnisolatedTools" in plain.description and "allowUnisolatedTools" not in described(plain)
    assert "this sandbox pod is the boundary" in described(plain)
    assert described(bwrap) == bwrap.description


def test_the_agents_page_gives_the_backends_own_queue_limit() -> None:
    # What a call waits for a free sandbox pod is not bounded by the tool's timeoutSeconds: the page says how long.
    from pathlib import Path

    from kuberl.engine.agents.sandbox_pod import QUEUE_SECONDS

    page = " ".join((Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text().split())
    assert f"a call waits up to {QUEUE_SECONDS:g} s for a free pod" in page
