"""Which distribution the trainer's log-probs are of: the sampling temperature, and when vLLM's
log-probs may stand for the old policy's."""

from __future__ import annotations

from pathlib import Path

import pytest

from kuberl.engine.config.algorithm import AlgorithmSpec
from kuberl.engine.config.rollout import RolloutSpec
from kuberl.engine.runtime.rl import recomputes_old_logprobs
from kuberl.engine.config.topology import policy_temperature
from kuberl.operator.cli.local_run import load_one
from kuberl.operator.control.planner import engine_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("temperature,trained", [(0.9, 0.9), (1.0, 1.0), (1.5, 1.5), (0.0, 1.0)])
def test_the_trainer_uses_the_sampling_temperature_and_greedy_keeps_plain_logits(temperature: float, trained: float) -> None:
    assert RolloutSpec(temperature=temperature, samples_per_prompt=1).training_temperature == trained


@pytest.mark.parametrize("top_p,top_k,truncates", [(1.0, -1, False), (0.95, -1, True), (1.0, 50, True), (0.5, 10, True)])
def test_top_p_or_top_k_truncate_the_sampled_distribution(top_p: float, top_k: int, truncates: bool) -> None:
    assert RolloutSpec(top_p=top_p, top_k=top_k).truncates is truncates


@pytest.mark.parametrize(
    "choice,half,truncated,recompute",
    [
        ("auto", False, False, False),  # float32, full distribution: vLLM's are the trainer's
        ("auto", True, False, True),  # bf16/fp16 kernels round differently
        ("auto", False, True, True),  # vLLM's are of the truncated distribution
        ("rollout", True, True, False),  # asked for: kept
        ("recompute", False, False, True),
    ],
)
def test_auto_recomputes_old_logprobs_where_vllm_and_the_trainer_differ(choice: str, half: bool, truncated: bool, recompute: bool) -> None:
    assert recomputes_old_logprobs(AlgorithmSpec(name="grpo", old_logprobs=choice), half, truncated) is recompute


def test_a_job_trains_at_its_rollout_temperature_and_dpo_at_one() -> None:
    grpo = engine_config(load_one(EXAMPLES / "grpo-smollm2-arith.yaml"))
    assert grpo.rollout is not None and policy_temperature(grpo) == grpo.rollout.temperature == 0.9
    assert policy_temperature(engine_config(load_one(EXAMPLES / "dpo.yaml"))) == 1.0
