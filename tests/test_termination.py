"""A failed rank's report: which errors a restart cannot mend, the report's bound, and what the operator reads back."""

from __future__ import annotations

import json

import pytest

from kuberl.engine.config.initialization import TERMINATION_MESSAGE_LIMIT
from kuberl.engine.config.termination import (
    NOT_RETRYABLE_EXIT_CODE,
    NotRetryable,
    TrainerFailure,
    exit_code_of,
    failure_of,
    read_failure,
)
from kuberl.engine.data.prompts import DataError
from kuberl.engine.distributed.world import WorldError
from kuberl.engine.models.arch import LlamaArch, UnsupportedModel
from kuberl.engine.models.resolve import ModelNotFound
from kuberl.engine.rewards.rewarder import RewardError
from kuberl.engine.runtime.algorithm_checks import ConfigError
from kuberl.engine.runtime.checkpoint_safety import CheckpointError
from kuberl.engine.runtime.plugins import PluginError


@pytest.mark.parametrize(
    "error,reason",
    [
        (ConfigError("roles.critic: grpo has no critic; remove the role"), "InvalidConfig"),
        (WorldError("environment variable WORLD_SIZE='x' is not an integer"), "InvalidConfig"),
        (ModelNotFound("model.path: /models/x is not a Hugging Face folder (no config.json)"), "ModelNotFound"),
        (UnsupportedModel("model_type 'gemma3' is not a Llama-family model"), "UnsupportedModel"),
        (RewardError("reward.python.path: importing /r.py failed: ZeroDivisionError: division by zero"), "RewardFailed"),
        (PluginError("algorithm.plugins[0]: importing /p.py failed"), "UserCodeFailed"),
        (DataError("/data/train.jsonl:3: not JSON"), "InvalidData"),
        (CheckpointError("/ckpt/step-2/rng.pt holds a pickled object outside the allow-list"), "CheckpointRefused"),
    ],
)
def test_errors_a_restart_cannot_mend_fail_at_once_with_their_reason(error: Exception, reason: str) -> None:
    failure = failure_of(error, "actor", 1)
    assert (failure.reason, failure.retryable, exit_code_of(failure)) == (reason, False, NOT_RETRYABLE_EXIT_CODE)
    assert failure.message.startswith(f"{type(error).__name__}: ") and str(error) in failure.message
    assert isinstance(error, NotRetryable) and isinstance(error, (ValueError, RuntimeError, FileNotFoundError))  # callers' excepts hold


@pytest.mark.parametrize(
    "error", [TimeoutError("collective timed out"), MemoryError(), OSError(5, "Input/output error"), ValueError("nan in the loss")]
)
def test_everything_else_restarts_the_gang(error: Exception) -> None:
    failure = failure_of(error, "critic", 0)
    assert failure.retryable and failure.reason == "Error" and exit_code_of(failure) == 1


class DistNetworkError(RuntimeError):
    """Named as torch.distributed's: the classification reads class names (the config layer has no torch)."""


def _raised_from(cause: BaseException) -> RuntimeError:
    try:
        raise RuntimeError("the step failed") from cause
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.7]:36777"),
        RuntimeError("Connection reset by peer"),
        DistNetworkError("failed to recv, got 0 bytes"),
        _raised_from(OSError(32, "Broken pipe")),
    ],
)
def test_a_rank_taken_down_by_a_lost_peer_says_so_and_restarts_the_gang(error: Exception) -> None:
    failure = failure_of(error, "actor", 0)
    assert (failure.reason, failure.retryable, exit_code_of(failure)) == ("PeerLost", True, 1)


def _lose_a_peer(rank: int, port: int, said) -> None:
    import os
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    dist.all_reduce(torch.ones(8))
    if rank == 1:
        os._exit(9)  # the peer goes, as a force-deleted pod's rank does
    time.sleep(0.5)
    try:
        for _ in range(3):
            dist.all_reduce(torch.ones(8))
        said.put("no error")
    except Exception as exc:  # noqa: BLE001 - what the worker would report
        said.put(failure_of(exc, "actor", 0).reason)


def test_a_real_gloo_peer_loss_is_classified_peer_lost() -> None:
    import multiprocessing

    from kuberl.operator.cli.ports import free_port

    context = multiprocessing.get_context("fork")  # the target is a function of this test module
    said = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_lose_a_peer, args=(rank, port, said)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    try:
        assert said.get(timeout=120) == "PeerLost"
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def test_an_unsupported_model_is_refused_as_such() -> None:
    with pytest.raises(UnsupportedModel, match="gemma3"):
        LlamaArch.from_hf_config({"model_type": "gemma3"})
    with pytest.raises(UnsupportedModel, match="rope_scaling"):
        LlamaArch.from_hf_config({"model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})


def test_the_report_fits_the_termination_message_however_long_the_error() -> None:
    # Kubernetes keeps 4096 bytes of it: a long message of multi-byte and escaped characters gives way, nothing else.
    failure = failure_of(ConfigError("é\n\x00" * 5000), "actor", 0)
    text = failure.to_json()
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    back = read_failure(text)
    assert back is not None and back.reason == "InvalidConfig" and back.message.startswith("ConfigError: é\n\x00")


@pytest.mark.parametrize(
    "message",
    [
        None,
        "",
        "Traceback (most recent call last):\n  ...",
        "{not json",
        '{"reason": "x"}',
        json.dumps({"reason": "Bad reason!", "retryable": False, "message": "m", "role": "actor", "rank": 0}),
        "{" + " " * 5000 + "}",
    ],
)
def test_anything_but_a_report_reads_as_none(message: str | None) -> None:
    # A log's tail (FallbackToLogsOnError), an older image's words, or a report a tool's code forged badly.
    assert read_failure(message) is None


def test_a_report_reads_back_as_written() -> None:
    failure = TrainerFailure(reason="ModelNotFound", retryable=False, message="ModelNotFound: model.path: /m", role="ref", rank=3)
    assert read_failure(failure.to_json()) == failure


def test_the_collective_timeout_is_the_jobs_unless_kuberl_run_overrides_it() -> None:
    from kuberl.engine.config.trainer import TrainerSpec
    from kuberl.engine.runtime.worker import collective_timeout_s

    assert TrainerSpec(total_steps=1).collective_timeout_seconds == 600
    assert collective_timeout_s({}, 1800) == 1800
    assert collective_timeout_s({"KUBERL_TIMEOUT_S": "45"}, 1800) == 45
    assert collective_timeout_s({"KUBERL_TIMEOUT_S": "soon"}, 1800) == 1800
    with pytest.raises(ValueError, match="greater than or equal to 30"):
        TrainerSpec(total_steps=1, collective_timeout_seconds=5)


def test_running_out_of_memory_while_a_model_loads_fails_the_job_at_once() -> None:
    import torch

    from kuberl.engine.runtime.load_memory import OutOfMemoryAtLoad, loading

    with pytest.raises(OutOfMemoryAtLoad, match=r"roles\.critic: .*ran out of memory while it loaded.*roles\.critic\.layout") as caught:
        with loading("critic"):
            torch.empty(1 << 50, dtype=torch.uint8)  # a petabyte: the real CPU allocator refuses it
    failure = failure_of(caught.value, "critic", 0)
    assert (failure.reason, failure.retryable) == ("OutOfMemoryAtLoad", False)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # any other error while loading passes through as it was
        with loading("actor"):
            raise RuntimeError("shape mismatch")
