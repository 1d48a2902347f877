"""A rank that cannot run its job says why, and that a restart would not help, in its termination message
(here KUBERL_TERMINATION_LOG; /dev/termination-log in a pod): through a real `kuberl run`, and, for a
model `kuberl run` refuses before any rank starts, a rank started as the operator's pods start it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from kuberl.engine.config.termination import read_failure

from .conftest import manifest


def _run(cli: str, job: Path, run: Path, log: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [cli, "run", str(job), "--out", str(run)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KUBERL_TERMINATION_LOG": str(log)},
    )


def _run_rank_as_a_pod_does(job: Path, run: Path, log: Path) -> subprocess.CompletedProcess:
    """The job's one rank, started as a trainer pod starts it: the engine's worker with the job's engine config
    and the rank's variables, no `kuberl run` around it."""
    from kuberl.operator.cli.local_run import LocalRank, load_one, rank_environment
    from kuberl.operator.cli.ports import free_port
    from kuberl.operator.control.planner import engine_config

    port = free_port()
    config = engine_config(load_one(job)).model_copy(update={"master_port": port})
    run.mkdir(parents=True)
    (run / "engine-config.json").write_text(config.model_dump_json(by_alias=True))
    rank = rank_environment(LocalRank(0, "actor", run / "rank-0.log"), 1, port, run / "engine-config.json", config.job, run, 1)
    rank["KUBERL_TERMINATION_LOG"] = str(log)
    return subprocess.run(
        [sys.executable, "-m", "kuberl.engine.runtime.worker"], env={**os.environ, **rank}, capture_output=True, text=True, timeout=600
    )


def test_an_unsupported_architecture_is_reported_as_not_retryable(kuberl_cli: str, tiny_model: Path, tmp_path: Path) -> None:
    model = tmp_path / "gemma"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "gemma3", "architectures": ["Gemma3ForCausalLM"]}))
    job = manifest(tmp_path / "job.yaml", model, tmp_path / "run", roles={}, layout={"dp": 1})
    doc_text = job.read_text().replace("gpusPerReplica: 2", "gpusPerReplica: 1")
    job.write_text(doc_text)
    log = tmp_path / "termination-log"
    # `kuberl run` reads the folder before any rank starts (as `validate --local` does): no rank, no report.
    refused = _run(kuberl_cli, job, tmp_path / "run", log)
    assert refused.returncode == 1 and "spec.model.path" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert not log.exists()
    # A pod's rank, which nothing checked before it started, reports it.
    result = _run_rank_as_a_pod_does(job, tmp_path / "run", log)
    assert result.returncode == 3, result.stderr[-3000:]  # NOT_RETRYABLE_EXIT_CODE: its Job fails, no gang restart
    failure = read_failure(log.read_text())
    assert failure is not None, log.read_text()[:500]
    assert (failure.reason, failure.retryable, failure.role, failure.rank) == ("UnsupportedModel", False, "actor", 0)
    assert "model_type 'gemma3'" in failure.message and "(supported: " in failure.message
    assert all(family in failure.message for family in ("llama", "qwen2", "qwen3", "mistral"))


def test_a_reward_file_that_fails_to_import_is_reported_as_not_retryable(kuberl_cli: str, tiny_model: Path, tmp_path: Path) -> None:
    reward = tmp_path / "reward.py"
    reward.write_text("import math\nSCALE = 1 / 0\n\ndef score(prompt, response, **kw):\n    return 0.0\n")
    job = manifest(
        tmp_path / "job.yaml", tiny_model, tmp_path / "run", layout={"dp": 1}, reward={"python": {"path": str(reward), "function": "score"}}
    )
    job.write_text(job.read_text().replace("gpusPerReplica: 2", "gpusPerReplica: 1"))
    log = tmp_path / "termination-log"
    result = _run(kuberl_cli, job, tmp_path / "run", log)
    assert result.returncode == 1, result.stderr[-3000:]
    failure = read_failure(log.read_text())
    assert failure is not None and (failure.reason, failure.retryable) == ("RewardFailed", False), log.read_text()[:500]
    assert "ZeroDivisionError" in failure.message and str(reward) in failure.message
    assert "exited with code 3" in result.stderr and "not retried" in result.stderr  # what `kuberl run` says of it
