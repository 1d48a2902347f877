"""The agentic demo: SmolLM2-135M learns to use the calculator for three-number sums.

Held-out greedy accuracy of the untrained model with the calculator (examples/agent-calculator.yaml's
multi-turn rollout: tool call, result, answer) and without it (the same question, answered directly
after the same worked example minus its tool call); then the example's training run, timed; then both
again on the trained model. Writes bench/results/agent_calculator.json.

Usage: .venv/bin/python bench/agent/run.py      (or: make agent-demo; about half an hour on 2 CPU cores)
       .venv/bin/python bench/agent/run.py eval MODEL_FOLDER [JOB]    (one evaluation, as JSON on stdout; JOB's
       task, prompt and tools, default examples/agent-calculator.yaml)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "agent-calculator.yaml"
RUN = REPO / "runs" / "agent-calculator"
OUT = REPO / "bench" / "results" / "agent_calculator.json"


def evaluate(model: Path, job: Path = JOB) -> dict:
    """Greedy accuracy on the job's validation sums, with the calculator and without it."""
    import transformers

    from kuberl.engine.agents import ChatRenderer, EnvironmentSetup, build_tools, describes_tools, parser_entry
    from kuberl.engine.data import PromptEncoder, load_examples
    from kuberl.engine.models.resolve import model_folder
    from kuberl.engine.rewards import math_answer
    from kuberl.engine.rollout.generation import Generator
    from kuberl.engine.rollout.multi_turn import MultiTurnRollout
    from kuberl.engine.rollout.vllm_backend import Sampling, VLLMRollout
    from kuberl.operator.validation.manifest import load_rljobs

    [rljob] = load_rljobs(job)
    spec, data, rollout_spec = rljob.spec, rljob.spec.data, rljob.spec.rollout
    multi = rollout_spec.multi_turn
    folder = model if model.name != "untrained" else model_folder(spec.model, REPO)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    plain_template = tokenizer.chat_template
    examples = load_examples(data.validation, data, REPO)
    stop = tuple(sorted({tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}))
    engine = VLLMRollout(
        folder,
        seed=0,
        max_model_len=data.max_prompt_length + multi.max_total_tokens,
        kv_cache_bytes=rollout_spec.kv_cache_bytes,
        skip_tokenizer_init=True,
    )
    greedy = Sampling(max_new_tokens=rollout_spec.max_new_tokens, temperature=0.0, stop_token_ids=stop)
    started = time.monotonic()

    # With the calculator: the job's own multi-turn rollout.
    parser = parser_entry(multi.parser)
    if not describes_tools(tokenizer):
        tokenizer.chat_template = parser.template
    tools = build_tools(multi.tools, REPO)
    schemas = [t.schema() for t in tools.values()]
    loop = MultiTurnRollout(
        Generator(engine, 0, 1, 1),
        ChatRenderer(tokenizer, schemas),
        EnvironmentSetup(multi, tools, parser),
        PromptEncoder(tokenizer, data, tools=schemas),
        data.max_prompt_length,
        stop,
    )
    _, trajectories = loop.generate(examples, greedy, seed=0)
    with_tools = [math_answer("", t.response, e.answer) for t, e in zip(trajectories, examples)]

    # Without it: the model's own chat template, the worked example's question and final answer only.
    tokenizer.chat_template = plain_template
    shots = [
        m
        for m in multi.environment_kwargs.get("few_shot", [])
        if m["role"] == "user" or (m["role"] == "assistant" and "<tool_call>" not in m["content"])
    ]
    encoder = PromptEncoder(tokenizer, data)
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                encoder.messages(e)[:1] + shots + encoder.messages(e)[1:], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )
        for e in examples
    ]
    alone = engine.generate(prompts, greedy)
    texts = tokenizer.batch_decode([c.token_ids for c in alone], skip_special_tokens=True)
    without_tools = [math_answer("", text, e.answer) for text, e in zip(texts, examples)]
    n = len(examples)
    return {
        "model": str(model.relative_to(REPO)) if model.is_absolute() and model.is_relative_to(REPO) else str(model),
        "prompts": n,
        "accuracy_with_tools": round(sum(with_tools) / n, 4),
        "accuracy_without_tools": round(sum(without_tools) / n, 4),
        "tool_call_rate": round(sum(t.tool_calls > 0 for t in trajectories) / n, 4),
        "turns_mean": round(sum(t.turns for t in trajectories) / n, 3),
        "tool_errors": sum(t.tool_errors for t in trajectories),
        "example_with_tools": trajectories[0].messages[-4:],
        "example_without_tools": texts[0],
        "seconds": round(time.monotonic() - started, 1),
    }


def evaluate_in_a_process(model: Path, job: Path = JOB) -> dict:
    """One evaluation in a fresh process (one vLLM engine per process)."""
    out = subprocess.run([sys.executable, __file__, "eval", str(model), str(job)], capture_output=True, text=True, cwd=REPO, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"evaluating {model} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    before = evaluate_in_a_process(Path("untrained"))
    print(f"untrained: {before['accuracy_with_tools']:.0%} with the calculator, {before['accuracy_without_tools']:.0%} without", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    run = subprocess.run(
        [str(REPO / ".venv" / "bin" / "kuberl"), "run", str(JOB.relative_to(REPO)), "--metrics-port", "0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=4 * 3600,
    )
    wall = time.monotonic() - started
    if run.returncode != 0:
        raise SystemExit(f"the training run failed:\n{run.stderr[-3000:]}")
    after = evaluate_in_a_process(RUN / "final")
    records = [json.loads(line) for line in (RUN / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if "reward_mean" in r]

    def mean(key: str, rows: list[dict]) -> float:
        return round(sum(r[key] for r in rows) / len(rows), 4)

    result = {
        "job": str(JOB.relative_to(REPO)),
        "steps": len(steps),
        "model": "SmolLM2-135M-Instruct",
        "task": "three-number sums, operands 0..50, 100 held-out prompts, greedy",
        "before": before,
        "after": after,
        "validation_reward_with_tools": {
            str(r["step"]): round(r["validation_reward_mean"], 4) for r in records if "validation_reward_mean" in r
        },
        "training_wall_seconds": round(wall, 1),
        "training_wall_minutes": round(wall / 60, 1),
        "mean_step_seconds": mean("step_seconds", steps),
        "training_reward_first_5_steps": mean("reward_mean", steps[:5]),
        "training_reward_last_5_steps": mean("reward_mean", steps[-5:]),
        "tool_calls_per_trajectory_first_5_steps": mean("multi_turn/tool_calls_per_trajectory", steps[:5]),
        "tool_calls_per_trajectory_last_5_steps": mean("multi_turn/tool_calls_per_trajectory", steps[-5:]),
        "policy_token_share_mean": mean("multi_turn/policy_token_share", steps),
        "turns_mean": mean("multi_turn/turns_mean", steps),
        "tool_errors_total": sum(r["multi_turn/tool_errors"] for r in steps),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "date": time.strftime("%Y-%m-%d"),
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"trained: {after['accuracy_with_tools']:.0%} with the calculator, {after['accuracy_without_tools']:.0%} without; "
        f"training {result['training_wall_minutes']} min; wrote {OUT.relative_to(REPO)}"
    )


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "eval":
        print(json.dumps(evaluate(Path(sys.argv[2]), *(Path(a) for a in sys.argv[3:]))))
    else:
        main()
