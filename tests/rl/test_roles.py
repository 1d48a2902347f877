"""Roles on ranks of their own: the world plan, checkpoints written by every role, and a whole job
whose critic, reference and reward model run on their own ranks computing what they compute colocated."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch

from kuberl.engine.config.topology import EngineConfig
from kuberl.engine.runtime import checkpoint as ckpt
from kuberl.engine.distributed.role_worlds import blocks


def engine_config(roles: dict, world_size: int) -> EngineConfig:
    return EngineConfig.model_validate(
        {
            "job": "j",
            "worldSize": world_size,
            "masterPort": 29500,
            "model": {"path": "m"},
            "data": {"train": {"path": "d.jsonl"}},
            "algorithm": {"name": "ppo"},
            "reward": {"rules": [{"name": "math_answer"}]},
            "trainer": {"totalSteps": 1},
            "roles": roles,
        }
    )


def role(ranks: int, offset: int, colocated: str | None = None, **layout) -> dict:
    return {
        "ranks": ranks,
        "rankOffset": offset,
        "procsPerPod": 1,
        "layout": layout or {"dp": ranks},
        **({"colocatedWith": colocated} if colocated else {}),
    }


def test_blocks_follow_the_roles_ranks() -> None:
    config = engine_config({"actor": role(2, 0), "critic": role(2, 2, tp=2), "ref": role(2, 0, colocated="actor"), "reward": role(1, 4)}, 5)
    found = blocks(config)
    assert [(b.role, b.offset, b.size, b.tp) for b in found] == [("actor", 0, 2, 1), ("critic", 2, 2, 2), ("reward", 4, 1, 1)]
    assert config.rank_roles() == ["actor", "actor", "critic", "critic", "reward"]


@pytest.mark.parametrize(
    "roles, world, message",
    [
        ({"actor": role(2, 0), "critic": role(2, 3)}, 5, "roles.critic: its ranks start at 3, expected 2"),
        ({"actor": role(2, 0), "critic": role(3, 2, tp=2, dp=1)}, 5, "roles.critic.layout: tp\\*pp = 2 does not divide its 3 ranks"),
        ({"actor": role(2, 0)}, 3, "worldSize is 3, but the roles' own ranks add up to 2"),
    ],
)
def test_blocks_refuse_a_world_they_do_not_tile(roles: dict, world: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        blocks(engine_config(roles, world))


def test_a_checkpoint_commits_only_with_every_part(tmp_path: Path) -> None:
    ckpt.prepare(tmp_path, 1)
    for rank in range(3):
        ckpt.write_part(tmp_path, 1, rank, {"rank": rank})
    ckpt.commit(tmp_path, 1, 3, keep=2)
    # Step 2 loses rank 2's part (a role died mid-save): the commit refuses, step 1 stays whole.
    ckpt.prepare(tmp_path, 2)
    for rank in range(2):
        ckpt.write_part(tmp_path, 2, rank, {"rank": rank})
    with pytest.raises(RuntimeError, match=r"lacks the parts of ranks \[2\]"):
        ckpt.commit(tmp_path, 2, 3, keep=2)
    assert ckpt.complete_steps(tmp_path) == [1]
    assert ckpt.load(tmp_path, 1, 2, 3) == {"rank": 2}
    with pytest.raises(RuntimeError, match="written by 3 ranks; this run has 4"):
        ckpt.load(tmp_path, 1, 0, 4)


@pytest.fixture(scope="module")
def reward_model(tiny_model: Path, tmp_path_factory) -> Path:
    """A random one-output sequence classifier with the tiny model's tokenizer."""
    import transformers

    out = tmp_path_factory.mktemp("rm") / "model"
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    transformers.LlamaForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.slow
def test_roles_on_their_own_ranks_compute_what_they_compute_colocated(make_job, run_job, reward_model: Path) -> None:
    reward = {"rules": [{"name": "math_answer"}], "model": {"path": str(reward_model), "dtype": "float32"}}
    common = dict(algorithm={"name": "ppo", "klCoef": 0.05}, samples=2, reward=reward)
    colocated_job, colocated = make_job("colocated", roles={r: {"colocateWith": "actor"} for r in ("critic", "ref", "reward")}, **common)
    # The critic gets the actor's layout (dp=2) on ranks 2-3, the reference and the reward model one rank each.
    own_job, own = make_job(
        "own", roles={"critic": {"replicas": 2, "layout": {"dp": 2}}, "ref": {"replicas": 1}, "reward": {"replicas": 1}}, **common
    )
    for job, run in ((colocated_job, colocated), (own_job, own)):
        result = run_job(job, run)
        assert result.returncode == 0, result.stderr[-3000:]
    logs = {r: (own / "logs" / f"rank-{r}.log").read_text() for r in range(6)}
    assert "role critic ready on ranks 2..3" in logs[2] and "role ref ready on ranks 4..4" in logs[4]
    assert "role reward ready on ranks 5..5" in logs[5]

    def steps(run: Path) -> list[dict]:
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    a, b = steps(colocated), steps(own)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    for left, right in zip(a, b):
        for key in ("reward_mean", "reward/model", "kl", "policy_loss", "entropy", "critic/value_loss", "critic/grad_norm"):
            assert math.isfinite(left[key]) and left[key] == pytest.approx(right[key], rel=1e-4, abs=1e-6), key
    # Every rank of the job, roles included, wrote its part of each checkpoint.
    parts = sorted(p.name for p in (own / "ckpt" / "step-00000002").glob("rank-*.pt"))
    assert parts == [f"rank-{r:05d}.pt" for r in range(6)]
    assert "critic" in torch.load(own / "ckpt" / "step-00000002" / "rank-00002.pt", weights_only=False)


@pytest.mark.slow
def test_a_killed_role_rank_ends_the_run_with_its_name(make_job, start_training) -> None:
    job, run = make_job(algorithm={"name": "ppo"}, samples=2, steps=50, roles={"critic": {"replicas": 1}})
    proc, pids = start_training(job, run)
    try:
        os.kill(pids["2"], signal.SIGKILL)  # the critic's only rank
        _, err = proc.communicate(timeout=120)  # no hang: the controller's link fails at once
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "rank 2 (role critic) exited with code -9" in err
