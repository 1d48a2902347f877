"""bench/train: the training phase with padded, packed, and packed + shared-prefix micro-batches.

One process (TP=1), SmolLM2-135M (the main job's model), one optimizer update per layout over the
same batch (the last layout: shared prefix with micro-batches filled to --micro-batch-tokens
instead of 8 sequences each), three batch shapes: the main job's (4 prompts x 8 samples, its chat-templated prompts,
responses of 4 to 24 tokens), long prompts with short answers, short prompts with long answers.
Each figure is the median of --repeat updates after a warm-up (2 prompts x 8 samples for the
last two shapes, to keep the bench to minutes on 2 cores). Reported: seconds per update,
tokens the model computed, achieved FLOP/s (the body's matmuls on the computed tokens, attention,
the LM head on the response positions, times 3 for forward and backward) and that as a fraction
of this machine's float32 matmul roofline, measured in the same run; and how each update's time
splits into forward + backward and the optimizer's step (Adam over every parameter, whatever the
batch).

    .venv/bin/python bench/train/run.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


def roofline(threads: int) -> float:
    """Float32 matmul FLOP/s of this machine at the bench's thread count (the best of a few sizes)."""
    best = 0.0
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        started = time.perf_counter()
        reps = 5
        for _ in range(reps):
            torch.mm(a, b)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - started))
    return best


def smollm2_policy():
    """SmolLM2-135M as a trainable MegatronLM on one gloo rank (TP = PP = DP = 1): (model, arch, tokenizer)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29400 + os.getpid() % 500))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from transformers import AutoTokenizer

    from kuberl.engine.config.trainer import OptimizerSpec
    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.models.loading import (
        gguf_to_hf_folder,
        read_hf_config,
        read_hf_state_dict,
        smollm2_gguf,
    )
    from kuberl.engine.training.policy import MegatronLM
    from kuberl.engine.distributed.world import init_model_parallel

    init_model_parallel(1, 1, seed=0)
    folder = gguf_to_hf_folder(smollm2_gguf())
    arch = LlamaArch.from_hf_config(read_hf_config(folder))
    model = MegatronLM(arch, read_hf_state_dict(folder), optimizer=OptimizerSpec(lr=1e-7))
    return model, arch, AutoTokenizer.from_pretrained(folder)


def loss_fn(logits, mb, totals):
    """The token-mean policy-gradient loss of one update (advantages 1)."""
    from kuberl.engine.training.policy import response_logprobs_from_logits

    logp = response_logprobs_from_logits(logits, mb)
    return -(logp * mb.advantages).sum() / mb.mask.sum().clamp(min=1) * totals.scale(mb, "token_mean"), {}


def timed_update(model, mbs, loss_fn) -> tuple[float, float]:
    """One update (MegatronLM.train_step) in its two parts: (forward + backward over the
    micro-batches, the optimizer's step)."""
    from kuberl.engine.training.loss_scale import UpdateTotals

    stats = model.train_step(mbs, loss_fn, 1e-7, UpdateTotals.alone(mbs))
    return stats["backward_seconds"], stats["optimizer_seconds"]


def pairs(x) -> int:
    """Query-key pairs the layout's attention computes: each padded row's s x s, or each packed
    segment's length squared (dense inside it)."""
    if x.segments is not None:
        return sum(s.length**2 for s in x.segments)
    rows, length = x.input_ids.shape
    return rows * length**2


def batches(tokenizer, seed: int = 0) -> dict[str, tuple[list[list[int]], list[list[int]]]]:
    from kuberl.engine.config.data import DataSpec, GeneratorSpec
    from kuberl.engine.data import PromptEncoder, arithmetic

    g = torch.Generator().manual_seed(seed)
    # The main job's data section (examples/grpo-smollm2-arith.yaml).
    data = DataSpec(
        train={"generator": GeneratorSpec(name="arithmetic", count=4, seed=1)},
        chat_template=True,
        system_prompt="You are a calculator. Reply with the result only, for example: 5 + 3 = 8.",
        max_prompt_length=128,
    )
    encoder = PromptEncoder(tokenizer, data)
    main_prompts = [encoder.encode(e) for e in arithmetic(GeneratorSpec(name="arithmetic", count=4, seed=1))]

    def responses(n: int, low: int, high: int) -> list[list[int]]:
        return [torch.randint(100, 20000, (int(torch.randint(low, high + 1, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]

    def grouped(prompts: list[list[int]], low: int, high: int) -> tuple[list[list[int]], list[list[int]]]:
        return [p for p in prompts for _ in range(8)], responses(8 * len(prompts), low, high)

    # Sized so that the whole bench takes minutes on 2 cores: 2 prompts x 8 samples each.
    long_prompts = [torch.randint(100, 20000, (192,), generator=g).tolist() for _ in range(2)]
    short_prompts = [torch.randint(100, 20000, (16,), generator=g).tolist() for _ in range(2)]
    return {
        "main_job": grouped(main_prompts, 4, 24),
        "long_prompt_short_answer": grouped(long_prompts, 4, 16),
        "short_prompt_long_answer": grouped(short_prompts, 64, 128),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--micro-batch-size",
        type=int,
        default=8,
        help="rows per micro-batch of the first three layouts (the main job's microBatchSize before its token budget)",
    )
    parser.add_argument("--micro-batch-tokens", type=int, default=2048, help="the token budget of the last layout (the main job's)")
    parser.add_argument("--batches", nargs="*", default=None, help="only these batches (default: all three)")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    from kuberl.engine.training.packing import token_micro_batches
    from kuberl.engine.training.sequences import micro_batches, pack

    model, arch, tokenizer = smollm2_policy()
    params = sum(p.numel() for p in model.module.parameters())
    head = arch.vocab_size * arch.hidden_size  # the (tied) embedding: a lookup at the input, a matmul at the output
    body = params - head
    peak = roofline(threads)

    results: dict = {}
    for name, (prompts, responses) in batches(tokenizer).items():
        if args.batches and name not in args.batches:
            continue
        batch = pack(prompts, responses, pad_id=0)
        batch.advantages = torch.ones_like(batch.mask)
        useful = sum(len(p) + len(r) for p, r in zip(prompts, responses))
        heads = int(batch.mask.sum())  # LM-head positions: one per response token, in every layout
        row: dict = {
            "sequences": len(batch),
            "prompt_tokens_mean": statistics.mean(map(len, prompts)),
            "response_tokens_mean": statistics.mean(map(len, responses)),
            "sequence_tokens": useful,
        }
        layouts = (
            ("padded", False, False, None),
            ("packed", True, False, None),
            ("packed_shared_prefix", True, True, None),
            ("packed_shared_prefix_tokens", True, True, args.micro_batch_tokens),
        )
        for layout, packed, shared, budget in layouts:
            model.packed, model.share_prefix = packed, shared
            mbs = micro_batches(batch, args.micro_batch_size) if budget is None else token_micro_batches(batch, budget, shared, model.span)
            inputs = model.model_inputs(mbs)
            tokens = sum(x.tokens for x in inputs)
            # Forward + backward = 3 x forward: the body's matmuls on every computed token, attention's
            # scores and sums over each row's (segment's) s x s, and the LM head on the response positions only.
            attention = sum(4 * arch.num_layers * arch.hidden_size * pairs(x) for x in inputs)
            flops = 3 * (2 * body * tokens + attention + 2 * head * heads)
            timed_update(model, mbs, loss_fn)  # warm-up
            parts = [timed_update(model, mbs, loss_fn) for _ in range(args.repeat)]
            s = statistics.median(f + o for f, o in parts)
            optimizer = statistics.median(o for _, o in parts)
            row[layout] = {
                "seconds_per_update": s,
                "forward_backward_seconds": s - optimizer,
                "optimizer_seconds": optimizer,
                "micro_batches": len(mbs),
                "tokens_computed": tokens,
                "flops_per_second": flops / s,
                "forward_backward_flops_per_second": flops / (s - optimizer),
            }
            print(
                f"{name:<26} {layout:<28} {s:7.2f} s (optimizer {optimizer:5.2f} s, {len(mbs)} micro-batches)  "
                f"{tokens:6d} tokens  {flops / s / 1e9:6.1f} GFLOP/s ({100 * flops / s / peak:4.1f}% of the first roofline)",
                flush=True,
            )
        for layout, *_ in layouts[1:]:
            row[f"speedup_{layout}"] = row["padded"]["seconds_per_update"] / row[layout]["seconds_per_update"]
        results[name] = row
    # The roofline again at the end, the higher one kept: this machine's speed drifts (a shared VM),
    # and a peak measured in a slow minute would flatter every fraction.
    peak = max(peak, roofline(threads))
    for name, row in results.items():
        for layout, *_ in layouts:
            row[layout]["roofline_fraction"] = row[layout]["flops_per_second"] / peak
            row[layout]["forward_backward_roofline_fraction"] = row[layout]["forward_backward_flops_per_second"] / peak
            print(f"{name:<26} {layout:<28} {100 * row[layout]['roofline_fraction']:4.1f}% of the roofline")
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "threads": threads,
        "model": "SmolLM2-135M-Instruct",
        "parameters": params,
        "fp32_matmul_roofline_flops": peak,
        "micro_batch_size": args.micro_batch_size,
        "micro_batch_tokens": args.micro_batch_tokens,
        "repeat": args.repeat,
        "batches": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    target = RESULTS / ("train.json" if not args.batches else "train_" + "_".join(args.batches) + ".json")
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(f"roofline {peak / 1e9:.1f} GFLOP/s; wrote {target}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
