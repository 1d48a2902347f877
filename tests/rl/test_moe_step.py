"""A GRPO step of a tiny Qwen3-MoE over 2 ranks with expert parallelism (ep=2), as a job runs it: megatron-core trains
with each rank holding 2 of the 4 experts of every layer (attention data-parallel over both), the switch gathers the
other rank's experts into each rank's vLLM, and the router's load-balancing loss is reported.

The micro-batches are packed under a token budget, so the two data-parallel ranks' rows (of different lengths) make
different numbers of them. Each forward's token dispatch is a collective of the ep group: the rank with fewer halves
its largest until it has as many (MegatronLM._as_many_as_the_expert_group); without that the step would hang.

tp=2 stays refused for a mixture of experts (tests/rl/test_family_steps.py says why and shows it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kuberl.engine.models.arch import LlamaArch

from .conftest import kuberl_run, manifest

pytestmark = pytest.mark.slow


def test_grpo_step_with_expert_parallelism(kuberl_cli: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from kuberl.engine.hybrid.plan import is_expert, moe_switch_bytes, transfer_units
    from kuberl.engine.models.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "model", family="qwen3_moe")
    run = tmp_path / "run"
    job = manifest(
        tmp_path / "job.yaml",
        model,
        run,
        name="tiny-qwen3-moe-ep",
        roles={},
        layout={"dp": 2, "ep": 2},
        steps=1,
        samples=4,
        promptsPerStep=2,
        microBatchSize=4,
        sequencePacking=True,
        microBatchTokens=40,
        reward={"rules": [{"name": "format", "args": {"pattern": r".*\d.*"}}]},
    )
    result = kuberl_run(kuberl_cli, job, run, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    [step] = [r for r in records if "reward_mean" in r]
    for key in ("policy_loss", "grad_norm", "reward_mean", "moe_aux_loss"):
        assert math.isfinite(step[key]), (key, step)
    assert step["grad_norm"] > 0 and step["update_skipped"] == 0, step
    # megatron-core's router loss (its coefficient, the config's router_aux_loss_coef, aside): about 1 for a balanced
    # router (E * sum_e f_e * p_e), reported as the step's mean over layers, micro-batches and data-parallel ranks.
    assert step["moe_aux_loss"] > 0, step
    # Each rank held 2 of the 4 experts: the switch moved the other 2 to it, and nothing else (tp = pp = 1).
    arch = LlamaArch.from_hf_config(json.loads((model / "config.json").read_text()))
    units = transfer_units(arch, 1, 1, 2)
    experts = sum(p.numel() * 4 for u in units if is_expert(u) for p in u.pieces)
    rest = sum(p.numel() * 4 for u in units if not is_expert(u) for p in u.pieces)
    assert step["reshard_bytes"] == moe_switch_bytes(rest, experts, 1, 1, 2) == experts / 2, step
    # vLLM sampled from the trained weights: its log-probs are the trainer's.
    assert step["response_length_mean"] > 0 and step["rollout/mismatch_max"] < 1e-3, step
    # The export gathered every expert from both ranks: the checkpoint's tensors, all there, the policy moved.
    start, final = load_file(model / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    assert set(final) == set(start)
    moved = {k for k in start if not (final[k] == start[k]).all()}
    assert {k for k in start if ".experts." not in k} <= moved
    assert any(".experts.0." in k for k in moved) and any(".experts.3." in k for k in moved), sorted(moved)
