"""One real GRPO step of `kuberl run` on a tiny random checkpoint of every registered model family
(engine/models/tiny.py's make_tiny_model(family=...): 2 layers, hidden 128, heads of 64, the character
tokenizer): megatron-core trains, vLLM generates, the switch moves the weights between them, as in a job.
The families come from the registry, so a new family file is run here without a change to this file.

Each run is one rank (dp=1), 2 prompts x 4 samples of 6 new tokens, and must finish with a finite loss,
a rollout that produced tokens, a non-zero gradient, and an exported policy unlike the checkpoint it
started from. The reward (a digit anywhere in the response, about one random response in two) differs
within a prompt's group, so GRPO's advantages, and with them the update, are not zero.

The mixture-of-experts families (qwen3_moe, mixtral) take their step here too, and report the router's
load-balancing loss (`moe_aux_loss`); tests/rl/test_moe_step.py runs one over 2 ranks with expert
parallelism. Every registered family takes a step: a family a job could not run would not be registered.

What stays refused for every mixture of experts is tensor parallelism (tp > 1): megatron-core 0.16.1's
MoE layer trains under tp only with sequence parallelism, which needs Transformer Engine, so a job with
tp=2 on one ends before any rank loads it (`test_a_mixture_of_experts_under_tensor_parallelism_is_refused`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kuberl.engine.models.families import FAMILIES

from .conftest import kuberl_run, manifest

pytestmark = pytest.mark.slow

MOE_UNDER_TP = (
    "tp=2 is not supported for mixture-of-experts models yet: megatron-core trains MoE under tensor "
    "parallelism only with sequence parallelism; use tp=1 (and ep)"
)
"""What `kuberl run` says of a mixture of experts under tp=2 (LlamaArch.check_layout)."""


def one_step_job(family: str, tmp_path: Path, layout: dict | None = None) -> tuple[Path, Path, Path]:
    """A tiny checkpoint of the family and a one-step GRPO job on it, one rank unless `layout` says more:
    (model, job, run folder)."""
    from kuberl.engine.models.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "model", family=family)
    run = tmp_path / "run"
    job = manifest(
        tmp_path / "job.yaml",
        model,
        run,
        name=f"tiny-{family.replace('_', '-')}",
        roles={},
        layout=layout or {"dp": 1},
        steps=1,
        samples=4,
        promptsPerStep=2,
        microBatchSize=4,
        reward={"rules": [{"name": "format", "args": {"pattern": r".*\d.*"}}]},
    )
    if layout is None:
        job.write_text(job.read_text().replace("gpusPerReplica: 2", "gpusPerReplica: 1"))
    return model, job, run


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_grpo_step_per_family(family: str, kuberl_cli: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model, job, run = one_step_job(family, tmp_path)
    result = kuberl_run(kuberl_cli, job, run, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "every rank finished" in result.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1], records
    step = steps[0]
    for key in ("policy_loss", "grad_norm", "entropy", "reward_mean", "rollout/mismatch_max"):
        assert key in step and math.isfinite(step[key]), (family, key, step.get(key))
    # The rollout generated: every response has tokens, and vLLM's log-probs are the trainer's (the switch
    # gave vLLM the family's weights under the names it reads).
    assert step["response_length_mean"] > 0 and step["rollout_tokens_per_second"] > 0, step
    assert step["train_positions"] > 0, step
    assert step["rollout/mismatch_max"] < 1e-3, step
    assert step["grad_norm"] > 0 and step["update_skipped"] == 0, step
    if FAMILIES[family].is_moe:  # the router's load-balancing loss, which megatron-core's router added to the gradient
        assert step["moe_aux_loss"] > 0 and math.isfinite(step["moe_aux_loss"]), step
    else:
        assert "moe_aux_loss" not in step, step
    # The policy moved: the export has the checkpoint's tensors, shapes and config, and their values changed.
    start, final = load_file(model / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    assert set(final) == set(start), set(final) ^ set(start)
    assert all(final[k].shape == start[k].shape for k in start)
    moved = {k for k in start if not (final[k] == start[k]).all()}
    # An expert the router sent none of the step's few tokens to has no gradient: it may stay as it was.
    expected = {k for k in start if ".experts." not in k}
    assert expected <= moved, f"{family}: unchanged after the step: {sorted(expected - moved)}"
    assert moved - expected or not FAMILIES[family].is_moe, f"{family}: no expert moved"
    assert json.loads((run / "final" / "config.json").read_text())["model_type"] == FAMILIES[family].example["model_type"]


@pytest.mark.parametrize("family", [name for name in sorted(FAMILIES) if FAMILIES[name].is_moe])
def test_a_mixture_of_experts_under_tensor_parallelism_is_refused(family: str, kuberl_cli: str, tmp_path: Path) -> None:
    _, job, run = one_step_job(family, tmp_path, layout={"tp": 2, "dp": 1})
    result = kuberl_run(kuberl_cli, job, run, timeout=300)
    assert result.returncode != 0, f"{family} ran under tp=2: megatron-core trains it there now, step it"
    assert MOE_UNDER_TP in result.stderr, result.stderr[-3000:]
    assert not (run / "metrics.jsonl").exists()
