"""LoRA on megatron-core (engine/training/lora.py): exactness against transformers, and the same
training in every parallel layout.

Each layout runs as separate gloo processes (tests/engine/workers/lora_check.py): a fresh adapter
(B = 0) must give the base model's log-probs bit for bit, and after a few updates the adapter,
merged into the base in transformers (fp32), must give Megatron's log-probs within 1e-5, at TP=2
and PP=2 as on one process. The base stays frozen, the reference (adapter off) stays the base, and
only the adapters reach the optimizer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from kuberl.engine.config.lora import LoRASpec
from kuberl.engine.models.loading import read_hf_state_dict
from kuberl.engine.models.lora_layout import gather_adapter, init_pair, merged, shard_pair
from kuberl.engine.models.arch import LlamaArch
from kuberl.operator.cli.ports import free_port

from .rank_processes import wait_for_ranks

WORKER = Path(__file__).parent / "workers" / "lora_check.py"
LORA = {"rank": 4, "alpha": 8, "targetModules": ["q", "k", "v", "o", "gate", "up", "down"]}


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory) -> tuple[Path, Path]:
    """A small random Llama with grouped queries (4 heads, 2 KV heads, 4 layers) and a batch."""
    directory = tmp_path_factory.mktemp("lora")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    transformers.LlamaForCausalLM(config).float().save_pretrained(directory / "model")
    gen = torch.Generator().manual_seed(1)
    lengths = [(5, 4), (3, 6), (7, 2), (4, 5)]
    prompts = [torch.randint(1, 256, (p,), generator=gen).tolist() for p, _ in lengths]
    responses = [torch.randint(1, 256, (r,), generator=gen).tolist() for _, r in lengths]
    torch.save({"prompts": prompts, "responses": responses, "advantages": torch.randn(4, 8, generator=gen)}, directory / "batch.pt")
    return directory / "model", directory / "batch.pt"


def run_lora(model: Path, batch: Path, out: Path, tp: int, pp: int, dp: int, lora: dict = LORA) -> dict:
    world = tp * pp * dp
    port = free_port()
    logs = [out.with_suffix(f".rank{r}.log") for r in range(world)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--rank",
                str(r),
                "--world",
                str(world),
                "--port",
                str(port),
                "--tp",
                str(tp),
                "--pp",
                str(pp),
                "--model",
                str(model),
                "--batch",
                str(batch),
                "--lora",
                json.dumps(lora),
                "--out",
                str(out),
            ],
            stdout=open(logs[r], "w"),
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    wait_for_ranks(procs, logs, timeout=400)
    return torch.load(out, weights_only=False)


def transformers_logprobs(model: Path, state: dict[str, torch.Tensor], batch: Path, width: int) -> torch.Tensor:
    """[B, width] log-probs of each response token under `state` in transformers (fp32)."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    hf.load_state_dict(state)
    blob = torch.load(batch)
    out = torch.zeros(len(blob["prompts"]), width)
    with torch.no_grad():
        for i, (p, r) in enumerate(zip(blob["prompts"], blob["responses"])):
            logits = hf(torch.tensor([p + r])).logits[0, len(p) - 1 : -1]
            out[i, : len(r)] = logits.log_softmax(-1).gather(-1, torch.tensor(r)[:, None])[:, 0]
    return out


@pytest.fixture(scope="module")
def single(lora_model, tmp_path_factory) -> dict:
    return run_lora(*lora_model, tmp_path_factory.mktemp("single") / "out.pt", 1, 1, 1)


def test_fresh_adapter_gives_the_base_models_logprobs_exactly(single) -> None:
    assert torch.equal(single["fresh"], single["base"])


def test_trained_adapter_equals_the_merged_model_in_transformers(lora_model, single) -> None:
    model, batch = lora_model
    out = single
    assert out["frozen"] and torch.equal(out["base_after"], out["base"])  # the reference is still the base
    assert all(n > 0 for n in out["grad_norms"]) and (out["trained"] - out["base"]).abs().max() > 1e-3
    spec = LoRASpec.model_validate(LORA)
    state = merged(read_hf_state_dict(model), out["adapter"], spec.scale())
    expected = transformers_logprobs(model, state, batch, out["mask"].shape[1]) * out["mask"]
    assert (out["trained"] - expected).abs().max() < 1e-5
    base = transformers_logprobs(model, read_hf_state_dict(model), batch, out["mask"].shape[1]) * out["mask"]
    assert (out["base"] - base).abs().max() < 1e-5
    # Only the adapters train: the optimizer holds them and nothing else.
    assert out["trainable"] == [out["adapter_numel"]] and out["optimized"] == [out["adapter_numel"]]


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 2, 1), (2, 1, 2)], ids=["tp2-pp2", "tp2-dp2"])
def test_parallel_layouts_train_the_same_adapter(lora_model, single, tmp_path: Path, tp: int, pp: int, dp: int) -> None:
    model, batch = lora_model
    out = run_lora(model, batch, tmp_path / "out.pt", tp, pp, dp)
    assert torch.equal(out["fresh"], out["base"]) and out["frozen"]
    assert (out["base"] - single["base"]).abs().max() < 1e-5
    # The trained adapter is the one-process run's (its gradients and Adam's steps under TP, PP and
    # DP's distributed optimizer), and merged in transformers it gives Megatron's log-probs.
    for name, tensor in single["adapter"].items():
        assert torch.allclose(out["adapter"][name], tensor, atol=1e-5, rtol=1e-4), name
    spec = LoRASpec.model_validate(LORA)
    state = merged(read_hf_state_dict(model), out["adapter"], spec.scale())
    expected = transformers_logprobs(model, state, batch, out["mask"].shape[1]) * out["mask"]
    assert (out["trained"] - expected).abs().max() < 1e-5
    # The distributed optimizer splits each model-parallel rank's adapters over its DP ranks.
    assert sum(out["optimized"]) == out["adapter_numel"]


@pytest.mark.slow
def test_dropout_masks_agree_across_tp_ranks(lora_model, tmp_path: Path) -> None:
    """With dropout, the TP ranks of a column-parallel layer draw one mask (its A sees one input), so
    the replicated halves of the adapters (A of q, k, v, gate, up; B of o, down) stay equal."""
    from kuberl.engine.models.lora_layout import split_kind

    out = run_lora(*lora_model, tmp_path / "out.pt", 2, 1, 1, lora={**LORA, "dropout": 0.2})
    zero, one = out["shards"][(0, 0)], out["shards"][(0, 1)]
    replicated = [
        n
        for n in zero
        if (n.endswith(".A") and split_kind(n.split(".lora_")[1][:-2]) == "column")
        or (n.endswith(".B") and split_kind(n.split(".lora_")[1][:-2]) == "row")
    ]
    assert len(replicated) == 4 * 7
    assert all(torch.equal(zero[n], one[n]) for n in replicated)
    assert any(not torch.equal(zero[n], one[n]) for n in zero if n.endswith(".B") and n not in replicated)


# --- layouts, without processes ---------------------------------------------------------------------


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_adapter_shards_gather_back_to_the_full_adapter(tp: int, pp: int) -> None:
    from kuberl.engine.models.convert import stage_layers
    from kuberl.engine.models.lora_layout import megatron_name

    arch = LlamaArch(
        vocab_size=8,
        hidden_size=16,
        intermediate_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=4,
        rms_norm_eps=1e-5,
        rope_theta=1e4,
        max_position_embeddings=8,
        tie_word_embeddings=False,
        qkv_bias=False,
    )
    targets = list(LoRASpec().target_modules)
    full = {}
    for layer in range(2):
        for target in targets:
            a, b = init_pair(arch, target, 3, layer, seed=1)
            full[(layer, target)] = (a, torch.randn_like(b))
    shards = {}
    for p in range(pp):
        for t in range(tp):
            shards[(p, t)] = {}
            for local, layer in enumerate(stage_layers(arch, p, pp)):
                for target in targets:
                    a, b = shard_pair(*full[(layer, target)], target, t, tp)
                    shards[(p, t)][megatron_name(local, target, "A")] = a
                    shards[(p, t)][megatron_name(local, target, "B")] = b
    adapter = gather_adapter(shards, arch, targets)
    assert len(adapter) == 2 * len(targets) * 2
    for (layer, target), (a, b) in full.items():
        from kuberl.engine.models.lora_layout import peft_name

        assert torch.equal(adapter[peft_name(layer, target, "A")], a) and torch.equal(adapter[peft_name(layer, target, "B")], b)


def test_initial_adapter_is_the_same_in_every_layout_and_adds_nothing() -> None:
    arch = LlamaArch(
        vocab_size=8,
        hidden_size=16,
        intermediate_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=4,
        rms_norm_eps=1e-5,
        rope_theta=1e4,
        max_position_embeddings=8,
        tie_word_embeddings=False,
        qkv_bias=False,
    )
    a, b = init_pair(arch, "q", 8, layer=1, seed=3)
    again, _ = init_pair(arch, "q", 8, layer=1, seed=3)
    assert torch.equal(a, again) and not torch.equal(a, init_pair(arch, "q", 8, layer=0, seed=3)[0])
    assert a.shape == (8, 16) and b.shape == (16, 8) and not b.any() and a.abs().max() <= 0.25


def test_a_lora_job_refuses_a_reference_on_ranks_of_its_own(tmp_path: Path) -> None:
    import yaml

    from kuberl.engine.runtime.checks import ConfigError, check_supported
    from kuberl.operator.cli.local_run import load_one
    from kuberl.operator.control.planner import engine_config

    def config(ref: dict):
        job = tmp_path / "job.yaml"
        job.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kuberl.dev/v1alpha1",
                    "kind": "RLJob",
                    "metadata": {"name": "j"},
                    "spec": {
                        "model": {"path": str(tmp_path)},
                        "data": {"train": {"generator": {"name": "arithmetic", "count": 8}}},
                        "algorithm": {"name": "grpo", "klCoef": 0.05},
                        "rollout": {"samplesPerPrompt": 4},
                        "reward": {"rules": [{"name": "math_answer"}]},
                        "roles": {"actor": {"replicas": 1}, "ref": ref},
                        "trainer": {"totalSteps": 1, "promptsPerStep": 2, "lora": {"rank": 8}},
                    },
                }
            )
        )
        return engine_config(load_one(job))

    check_supported(config({"colocateWith": "actor"}))  # the base with the adapter off, on the actor's ranks
    with pytest.raises(ConfigError, match="roles.ref: with trainer.lora the reference is the base model"):
        check_supported(config({"replicas": 1}))


def test_cpu_lora_kernels_compute_what_vllm_cpus_compute() -> None:
    """engine/compat/vllm_cpu_lora.py against vLLM's own torch ops: several adapters in one batch,
    shrink, expand and expand into a slice; a token without an adapter (-1) gets nothing added."""
    from vllm.lora.ops.torch_ops import lora_ops as vllm_ops

    from kuberl.engine.compat import vllm_cpu_lora as ours

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 16, generator=gen)
    a = torch.randn(3, 1, 4, 16, generator=gen)  # 3 slots of rank 4 on 16 inputs
    b = torch.randn(3, 1, 10, 4, generator=gen)
    idx = torch.tensor([0, 2, 2, 1, 0, 2, 1])
    for fn in ("bgmv_shrink",):
        mine, theirs = torch.zeros(7, 4), torch.zeros(7, 4)
        getattr(ours, fn)(x, a, mine, idx, 0.5)
        getattr(vllm_ops, fn)(x, a, theirs, idx, 0.5)
        assert torch.allclose(mine, theirs, atol=1e-6)
    z = torch.randn(7, 4, generator=gen)
    mine, theirs = torch.ones(7, 12), torch.ones(7, 12)
    ours.bgmv_expand(z, b, mine, idx, add_inputs=True)
    vllm_ops.bgmv_expand(z, b, theirs, idx, add_inputs=True)
    assert torch.allclose(mine, theirs, atol=1e-6)
    mine, theirs = torch.ones(7, 30), torch.ones(7, 30)
    ours.bgmv_expand_slice(z, b, mine, idx, 10, 10, add_inputs=True)
    vllm_ops.bgmv_expand_slice(z, b, theirs, idx, 10, 10, add_inputs=True)
    assert torch.allclose(mine, theirs, atol=1e-6)
    seq_lens, per_seq = torch.tensor([3, 4]), torch.tensor([1, -1])
    mine = torch.ones(7, 12)
    ours.sgmv_expand(z, b, mine, None, seq_lens, per_seq, 2, 4, 7, add_inputs=True)
    assert torch.allclose(mine[:3, :10], 1 + z[:3] @ b[1, 0].T, atol=1e-6) and torch.equal(mine[:3, 10:], torch.ones(3, 2))
    assert torch.equal(mine[3:], torch.ones(4, 12))
