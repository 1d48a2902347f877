"""Megatron shards back to a Hugging Face folder that transformers loads with the same outputs."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from kuberl.engine.models.arch import LlamaArch
from kuberl.engine.models.convert import hf_to_megatron, megatron_to_hf
from kuberl.engine.models.loading import export_hf_folder, read_hf_config, read_hf_state_dict


def test_export_from_tp2_pp2_shards_loads_in_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    original = transformers.Qwen2ForCausalLM(config).float().eval()
    arch = LlamaArch.from_hf_config(config.to_dict())
    shards = {(p, t): hf_to_megatron(original.state_dict(), arch, t, 2, p, 2) for p in range(2) for t in range(2)}
    folder = export_hf_folder(megatron_to_hf(shards, arch), config.to_dict(), tmp_path / "final")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert not list(tmp_path.glob("final.*")), "the staging folder was left behind"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, original(ids).logits)
    assert read_hf_config(folder)["model_type"] == "qwen2"
    assert "lm_head.weight" not in read_hf_state_dict(folder)  # tied, stored once
