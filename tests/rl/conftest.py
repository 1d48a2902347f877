"""A tiny random Llama with SmolLM2's tokenizer (vLLM on CPU needs head size 64), and RLJob manifests around it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    import torch
    import transformers

    from kuberl.engine.models.loading import gguf_to_hf_folder, smollm2_gguf

    out = tmp_path_factory.mktemp("tiny") / "model"
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_to_hf_folder(smollm2_gguf()))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    transformers.LlamaForCausalLM(config).float().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def manifest(
    path: Path,
    model: Path,
    run: Path,
    *,
    name: str = "tiny",
    algorithm: dict | None = None,
    layout: dict | None = None,
    roles: dict | None = None,
    steps: int = 2,
    data: dict | None = None,
    samples: int = 4,
    reward: dict | None = None,
    checkpoint_interval: int = 1,
    rollout: dict | None = None,
    **trainer,
) -> Path:
    """An RLJob for the tiny model that writes everything under `run`."""
    spec = {
        "model": {"path": str(model), "dtype": "float32"},
        "data": data or {"train": {"generator": {"name": "arithmetic", "count": 32, "seed": 1, "maxOperand": 9}}, "maxPromptLength": 64},
        "algorithm": algorithm or {"name": "grpo"},
        "rollout": {"samplesPerPrompt": samples, "maxNewTokens": 6, "kvCacheBytes": 64 << 20, **(rollout or {})},
        "reward": reward or {"rules": [{"name": "math_answer"}, {"name": "length_penalty", "weight": 0.1, "args": {"max_chars": 6}}]},
        "roles": {"actor": {"replicas": 1, "gpusPerReplica": 2, "layout": layout or {"dp": 2}}, **(roles or {})},
        "trainer": {
            "totalSteps": steps,
            "promptsPerStep": 4,
            "microBatchSize": 4,
            "seed": 3,
            "optimizer": {"lr": 1e-4},
            "checkpoint": {"path": str(run / "ckpt"), "interval": checkpoint_interval, "keep": 2},
            "exportPath": str(run / "final"),
            **trainer,
        },
        "monitoring": {"enabled": False},
    }
    if spec["algorithm"]["name"] == "dpo":
        spec.pop("rollout")
        spec.pop("reward")
    doc = {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name}, "spec": spec}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def kuberl_run(cli: str, job: Path, run: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([cli, "run", str(job), "--out", str(run)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def make_job(tiny_model: Path, tmp_path: Path):
    def make(run_name: str = "run", **kwargs) -> tuple[Path, Path]:
        run = tmp_path / run_name
        return manifest(tmp_path / f"{run_name}.yaml", tiny_model, run, **kwargs), run

    return make


@pytest.fixture
def run_job(kuberl_cli: str):
    def run(job: Path, out: Path, timeout: int = 600) -> subprocess.CompletedProcess:
        return kuberl_run(kuberl_cli, job, out, timeout)

    return run


@pytest.fixture
def start_training(kuberl_cli: str):
    """`kuberl run` started and past its first step; gives the process and the ranks' pids."""

    def start(job: Path, run: Path, preexec_fn=None, threads: int | None = None) -> tuple[subprocess.Popen, dict[str, int]]:
        proc = subprocess.Popen(
            [kuberl_cli, "run", str(job), "--out", str(run), *(["--threads", str(threads)] if threads else [])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=preexec_fn,
        )
        deadline = time.monotonic() + 300
        while not (run / "metrics.jsonl").exists():  # training is under way
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"the run did not get going: {proc.communicate()[1][-3000:]}")
            time.sleep(0.05)  # steps of the tiny model are short: act soon after the first
        return proc, {rank: int(pid) for rank, pid in json.loads((run / "logs" / "ranks.json").read_text()).items()}

    return start
