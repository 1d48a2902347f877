"""A tiny random model of any registered family (a Llama by default) with a character-level tokenizer and a
chat template: a real Hugging Face folder that needs nothing downloaded, for `kuberl smoke` and tests."""

from __future__ import annotations

import string
from pathlib import Path

SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer():
    """One token per printable ASCII character, plus pad and the chat markers."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    core = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    # Specials first, then single characters.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"<\|im_start\|>|<\|im_end\|>|<pad>|[\s\S]"), behavior="isolated")
    core.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<|im_end|>", bos_token="<|im_start|>", unk_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# The family example's fields a tiny model does not take: its rope is the default one, its norms' epsilon transformers'.
NOT_TAKEN = ("rope_scaling", "rope_parameters", "rope_theta", "rms_norm_eps")


def tiny_config(
    family: str = "llama",
    *,
    layers: int = 2,
    hidden: int = 128,
    vocab: int = 128,
    bos: int | None = None,
    eos: int | None = None,
    pad: int | None = None,
) -> dict:
    """A tiny config.json of `family` (engine/models/families/): its example config's own fields (experts, biases,
    windows off) at the tiny shape, with head size 64, as vLLM's CPU attention needs."""
    from .families import FAMILIES

    if family not in FAMILIES:
        raise ValueError(f"no model family {family!r} (registered: {', '.join(sorted(FAMILIES))})")
    if hidden % 64:
        raise ValueError(f"hidden={hidden}: a tiny model's heads are 64 wide, so hidden must be a multiple of 64")
    example = FAMILIES[family].example
    config = {k: v for k, v in example.items() if k not in NOT_TAKEN}
    config.update(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    if "head_dim" in example:
        config["head_dim"] = 64
    if "moe_intermediate_size" in example:
        config["moe_intermediate_size"] = hidden
    return config


def make_tiny_model(out: Path, *, layers: int = 2, hidden: int = 128, seed: int = 0, family: str = "llama") -> Path:
    """Write a random model of `family` (tiny_config) and its tokenizer to `out`. Its q/k/v biases and q/k norms,
    where the family has them, are random too (a Llama's weights are as transformers initialises them)."""
    import torch
    import transformers

    tokenizer = char_tokenizer()
    vocab = 128  # the ~100 tokens, rounded up so that TP=2 and TP=4 split the vocabulary evenly
    config = tiny_config(
        family,
        layers=layers,
        hidden=hidden,
        vocab=vocab,
        bos=tokenizer.bos_token_id,
        eos=tokenizer.eos_token_id,
        pad=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).float()
    with torch.no_grad():  # what transformers starts at a constant a test would not see moved or lost: drawn
        for name, weight in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):  # Qwen3's per-head norms, all ones
                weight.copy_(1 + 0.5 * torch.randn_like(weight))
            elif name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):  # Qwen2's biases, all zeros
                weight.copy_(0.2 * torch.randn_like(weight))
            elif config["model_type"].startswith("gemma") and name.endswith("norm.weight"):  # Gemma's: 1 + 0
                weight.copy_(0.5 * torch.randn_like(weight))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
