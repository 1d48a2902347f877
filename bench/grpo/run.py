"""kuberl against TRL's GRPOTrainer on the same CPU task, model and batch, in one invocation.

Both train SmolLM2-135M-Instruct with GRPO on the arithmetic prompts of
examples/grpo-smollm2-arith.yaml: 4 prompts x 8 samples per step, at most 24 new tokens,
temperature 0.9 (both train the tempered policy's log-probs), lr 1e-5, no KL term,
group-normalised advantages, token-mean loss, one optimizer update per step over all 32 sequences
in one micro-batch (TRL: per-device batch 32, no accumulation,
padded; kuberl: the example's token budget, shared prompts), 2 CPU threads each.
Both see the same prompts in the same order (kuberl's loader's; TRL does not shuffle). Reported:
seconds per step (the first step, a warm-up, is left out; checkpoint time is left out of kuberl's),
completions per second, the mean sampled reward over all steps and over the last half, and the
mean per-step difference of the two rewards with its standard error.

Needs TRL: `make bench-setup`. Usage: .venv/bin/python bench/grpo/run.py [--steps 8]
Writes bench/results/grpo.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "grpo-smollm2-arith.yaml"


def our_run(steps: int, work: Path) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    spec["data"].pop("validation", None)
    spec["trainer"].update(
        totalSteps=steps,
        validationInterval=0,
        exportPath=None,
        checkpoint={"path": str(work / "kuberl" / "checkpoints"), "interval": 1000, "keep": 1},
    )
    spec["trainer"].pop("exportPath")
    spec["model"]["gguf"] = str(REPO / spec["model"]["gguf"])
    spec["monitoring"] = {"enabled": False}
    job = work / "kuberl.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    started = time.perf_counter()
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "kuberl"), "run", str(job), "--out", str(work / "kuberl"), "--threads", "2"], check=True, cwd=REPO
    )
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (work / "kuberl" / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["step_seconds"] - r["phase_seconds"].get("checkpoint", 0.0) for r in records]
    rewards = [r["reward_mean"] for r in records]
    return {"seconds_per_step": seconds, "rewards": rewards, "wall_seconds": wall, "reshard_share": [r["reshard_share"] for r in records]}


def trl_run(steps: int, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from kuberl.engine.config.data import GeneratorSpec
    from kuberl.engine.data import PromptLoader, arithmetic
    from kuberl.engine.models.loading import gguf_to_hf_folder, smollm2_gguf
    from kuberl.engine.rewards import math_answer

    torch.set_num_threads(2)
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    system = spec["data"]["systemPrompt"]
    gen = spec["data"]["train"]["generator"]
    examples = arithmetic(GeneratorSpec(name="arithmetic", count=gen["count"], seed=gen["seed"], max_operand=gen["maxOperand"]))
    # The prompts kuberl's loader gives its steps, in its order, and TRL told not to shuffle: both
    # sides see the same 4 prompts at every step, so their rewards compare step by step.
    loader = PromptLoader(examples, spec["trainer"]["promptsPerStep"], spec["trainer"]["seed"])
    ordered = [e for _ in range(steps) for e in loader.next_batch()]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "system", "content": system}, {"role": "user", "content": e.prompt}], "answer": e.answer} for e in ordered]
    )

    seen: list[str] = []

    def reward(prompts, completions, answer, **_):
        seen.extend(p[-1]["content"] for p in prompts)
        return [math_answer("", c[0]["content"], a) for c, a in zip(completions, answer)]

    folder = gguf_to_hf_folder(smollm2_gguf())
    rollout, trainer_spec = spec["rollout"], spec["trainer"]
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        max_steps=steps,
        learning_rate=trainer_spec["optimizer"]["lr"],
        per_device_train_batch_size=32,
        gradient_accumulation_steps=1,
        num_generations=rollout["samplesPerPrompt"],
        max_completion_length=rollout["maxNewTokens"],
        temperature=rollout["temperature"],
        top_k=0,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        max_grad_norm=trainer_spec["optimizer"]["gradClip"],
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=trainer_spec["seed"],
        disable_dropout=True,
        dataloader_num_workers=0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        shuffle_dataset=False,
    )
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.started)

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    trainer = GRPOTrainer(
        model=model, reward_funcs=[reward], args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[Clock()]
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    samples = rollout["samplesPerPrompt"]
    if seen[::samples] != [e.prompt for e in ordered]:
        raise SystemExit("TRL did not see kuberl's prompts in kuberl's order: the rewards would not compare")
    return {"seconds_per_step": times, "rewards": rewards, "wall_seconds": wall}


def summary(run: dict, completions_per_step: int) -> dict:
    steady = run["seconds_per_step"][1:] or run["seconds_per_step"]
    per_step = sum(steady) / len(steady)
    rewards = run["rewards"]
    half = rewards[len(rewards) // 2 :]
    return {
        "seconds_per_step": round(per_step, 2),
        "completions_per_second": round(completions_per_step / per_step, 3),
        "reward_mean": round(sum(rewards) / len(rewards), 4),
        "reward_last_half_mean": round(sum(half) / len(half), 4),
        "rewards": [round(r, 4) for r in rewards],
    }


def paired_reward_difference(ours: list[float], theirs: list[float]) -> dict:
    """Mean over steps of (kuberl's - TRL's) sampled reward on the same prompts, with its standard
    error: the noise of 32 samples a step is what decides whether a difference means anything."""
    diffs = [a - b for a, b in zip(ours, theirs)]
    mean = sum(diffs) / len(diffs)
    spread = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5 if len(diffs) > 1 else float("nan")
    return {"mean": round(mean, 4), "standard_error": round(spread / len(diffs) ** 0.5, 4)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "grpo.json"))
    args = parser.parse_args()
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    completions = spec["trainer"]["promptsPerStep"] * spec["rollout"]["samplesPerPrompt"]
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        work = Path(tmp)
        ours = our_run(args.steps, work)
        theirs = trl_run(args.steps, work)
    result = {
        "task": "GRPO, SmolLM2-135M-Instruct, arithmetic, 4 prompts x 8 samples, 24 new tokens, fp32, 2 CPU threads",
        "steps": args.steps,
        "kuberl": summary(ours, completions) | {"reshard_share_mean": round(sum(ours["reshard_share"]) / len(ours["reshard_share"]), 4)},
        "trl": summary(theirs, completions),
    }
    result["throughput_ratio"] = round(result["kuberl"]["completions_per_second"] / result["trl"]["completions_per_second"], 2)
    result["reward_difference_per_step"] = paired_reward_difference(ours["rewards"], theirs["rewards"])
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
