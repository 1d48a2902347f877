"""Multi-turn steps with the calculator tool under GRPO, RLOO and PPO (a critic), on a tiny model taught to
call the calculator (tool_model.py): vLLM samples the calls, the hermes parser reads them out of the
policy's own text, the calculator runs them, and the step trains on the policy's tokens only.

One rank per algorithm family (workers/multi_turn_steps.py; PPO's critic needs a run of its own), each
step recording the estimator it called and, per trajectory, what its packed row's loss mask kept."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .tool_model import teach_tool_calls, tool_job

pytestmark = pytest.mark.slow
WORKER = Path(__file__).parent / "workers" / "multi_turn_steps.py"
# What each preset says it estimates advantages with (engine/algorithms/presets/).
ESTIMATOR = {"grpo": "grpo", "rloo": "rloo", "ppo": "gae"}


@pytest.fixture(scope="module")
def taught_model(tiny_model: Path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("taught")
    return teach_tool_calls(tiny_model, tool_job(folder / "job.yaml", tiny_model, folder / "run"), folder / "model")


def steps_of(model: Path, tmp_path: Path, algorithms: list[dict], roles: dict | None = None) -> list[dict]:
    """One real step of each algorithm on one rank of a multi-turn calculator job."""
    from kuberl.operator.cli.local_run import load_one
    from kuberl.operator.control.planner import engine_config
    from kuberl.operator.cli.ports import free_port

    run = tmp_path / "run"
    job = tool_job(tmp_path / "job.yaml", model, run, algorithm=algorithms[0], roles=roles)
    config = engine_config(load_one(job)).model_copy(update={"master_port": free_port()})
    run.mkdir(parents=True)
    (run / "engine-config.json").write_text(config.model_dump_json(by_alias=True))
    out = tmp_path / "steps.jsonl"
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(config.master_port),
        "KUBERL_CONFIG": str(run / "engine-config.json"),
        "KUBERL_ROLE": "actor",
        "KUBERL_JOB": "tools",
        "KUBERL_RUN_DIR": str(run),
        "KUBERL_THREADS": "2",
        "OMP_NUM_THREADS": "2",
    }
    proc = subprocess.run(
        [sys.executable, str(WORKER), "--algorithms", json.dumps(algorithms), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    steps = [json.loads(line) for line in out.read_text().splitlines()]
    assert [s["algorithm"]["name"] for s in steps] == [a["name"] for a in algorithms]
    return steps


def check_common(step: dict, *keys: str) -> list[dict]:
    """Finite losses, the preset's estimator, tool calls that ran, and tool results out of the loss."""
    from kuberl.engine.config.algorithm import PRESET_ADVANTAGE

    name = step["algorithm"]["name"]
    assert step["estimators"] == [ESTIMATOR[name]] == [PRESET_ADVANTAGE[name]], (name, step["estimators"])
    assert step["moved"], f"{name}: the actor's weights did not change"
    for key in (
        "reward_mean",
        "policy_loss",
        "grad_norm",
        "multi_turn/turns_mean",
        "multi_turn/policy_token_share",
        "multi_turn/tool_calls",
        "multi_turn/tool_errors",
        "multi_turn/tool_calls_per_trajectory",
        "multi_turn/tool_seconds_mean",
        *keys,
    ):
        assert key in step and math.isfinite(step[key]), (name, key, step.get(key))
    assert step["multi_turn/tool_calls"] > 0 and 0 < step["multi_turn/policy_token_share"] < 1, step
    trajectories = step["trajectories"]
    assert len(trajectories) == 2 * 4  # promptsPerStep x samplesPerPrompt
    for t in trajectories:
        assert t["own_mask_is_the_rows"]  # the packed row's loss mask is the trajectory's
        trained, not_trained = "".join(t["trained"]), "".join(t["not_trained"])
        assert "<tool_response>" not in trained, t  # no tool result is in the tokens the loss reads
        tool_messages = [m for m in t["messages"] if m["role"] == "tool"]
        for m in tool_messages:  # every tool result the policy read is in the sequence, masked out
            assert any("<tool_response>" in run and m["content"] in run for run in t["not_trained"]), (m, t)
        if tool_messages:
            assert "<tool_call>" in trained and "<tool_call>" not in not_trained, t
    return trajectories


def ran_own_calls(trajectories: list[dict]) -> int:
    """How many trajectories hold a tool call of the policy's own text that the calculator ran: the
    assistant turn is in the trained (sampled) tokens, the hermes parser reads a calculator call out of
    it, and the next message is the calculator's result for that call's expression."""
    from kuberl.engine.agents import parser_entry
    from kuberl.engine.agents.calculator import evaluate, format_number

    hermes, count = parser_entry("hermes"), 0
    for t in trajectories:
        messages = t["messages"]
        for i, m in enumerate(messages[:-1]):
            if m["role"] != "assistant" or m["content"] not in "".join(t["trained"]):
                continue  # few-shot or prompt messages: not the policy's sampled text
            calls = hermes.parse(m["content"]).calls
            if not calls or calls[0].name != "calculator":
                continue
            expected = format_number(evaluate(calls[0].arguments["expression"]))
            reply = messages[i + 1]
            assert reply["role"] == "tool" and reply["content"] == expected, (m, reply)
            count += 1
            break
    return count


def test_multi_turn_tool_calls_under_grpo_and_rloo(taught_model: Path, tmp_path: Path) -> None:
    steps = steps_of(taught_model, tmp_path, [{"name": "grpo"}, {"name": "rloo"}])
    for step in steps:
        trajectories = check_common(step)
        # The taught policy calls the calculator in most of its sampled trajectories, of its own text.
        assert ran_own_calls(trajectories) >= len(trajectories) // 2, [t["messages"][-4:] for t in trajectories]


def test_multi_turn_tool_calls_under_ppo_with_a_critic(taught_model: Path, tmp_path: Path) -> None:
    [step] = steps_of(
        taught_model,
        tmp_path,
        [{"name": "ppo", "ppo": {"gae": {"gamma": 1.0, "lambda": 0.95}}}],
        roles={"critic": {"colocateWith": "actor"}},
    )
    trajectories = check_common(step, "critic/value_loss", "critic/grad_norm")
    assert ran_own_calls(trajectories) >= len(trajectories) // 2
