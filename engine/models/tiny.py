"""A tiny random Llama with a character-level tokenizer and a chat template: a real Hugging Face
folder that needs nothing downloaded, for `kuberl smoke` and tests."""

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
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<|im_end|>",
                                        bos_token="<|im_start|>", unk_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_model(out: Path, *, layers: int = 2, hidden: int = 128, seed: int = 0) -> Path:
    """Write a random Llama (head size 64, as vLLM's CPU attention needs) and its tokenizer to `out`."""
    import torch
    import transformers

    tokenizer = char_tokenizer()
    vocab = 128  # the ~100 tokens, rounded up so that TP=2 and TP=4 split the vocabulary evenly
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    transformers.LlamaForCausalLM(config).float().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
