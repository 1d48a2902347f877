"""bench/train/attention_weight.py: what the segment cost model's attention weight does to an update.

`packing.attention_span` weighs a pair of attended positions at some multiple of its FLOPs; that
weight decides how many samples of a prompt share one segment. This times one optimizer update of
SmolLM2-135M (shared prefix, the main job's 2048-position budget) over bench/train's batches with
the layout each weight gives (4: the weight before torch's fused attention, 2: the engine's now,
1, 0.5), in rounds that interleave the weights, median of --repeat after a warm-up each.

    .venv/bin/python bench/train/attention_weight.py [--batches short_prompt_long_answer] [--repeat 3]

Writes bench/results/train_attention_weight.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime, timezone

import torch

from run import RESULTS, batches, loss_fn, smollm2_policy, timed_update

WEIGHTS = (4.0, 2.0, 1.0, 0.5)
ENGINE_WEIGHT = 2.0  # the weight packing.attention_span uses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--batches", nargs="*", default=["short_prompt_long_answer", "main_job"])
    args = parser.parse_args()
    from kuberl.engine.training.packing import attention_span, token_micro_batches
    from kuberl.engine.training.sequences import pack

    model, arch, tokenizer = smollm2_policy()
    model.packed, model.share_prefix = True, True
    engine_span = attention_span(arch)
    results: dict = {}
    for name, (prompts, responses) in batches(tokenizer).items():
        if name not in args.batches:
            continue
        batch = pack(prompts, responses, pad_id=0)
        batch.advantages = torch.ones_like(batch.mask)
        layouts = {}
        for weight in WEIGHTS:
            span = engine_span * ENGINE_WEIGHT / weight
            mbs = token_micro_batches(batch, args.micro_batch_tokens, True, span)
            model.span = span
            inputs = model.model_inputs(mbs)
            layouts[weight] = (span, mbs, sum(x.tokens for x in inputs), sum(x.attention_blocks for x in inputs))
            timed_update(model, mbs, loss_fn)  # warm-up
        seconds: dict[float, list[float]] = {w: [] for w in WEIGHTS}
        for _ in range(args.repeat):
            for weight, (span, mbs, _, _) in layouts.items():
                model.span = span
                seconds[weight].append(sum(timed_update(model, mbs, loss_fn)))
        results[name] = {
            str(w): {
                "span": layouts[w][0],
                "tokens_computed": layouts[w][2],
                "segments": layouts[w][3],
                "seconds_per_update": statistics.median(seconds[w]),
            }
            for w in WEIGHTS
        }
        for w in WEIGHTS:
            row = results[name][str(w)]
            print(
                f"{name:<26} weight {w:>3}: {row['segments']:3d} segments, {row['tokens_computed']:5d} tokens, "
                f"{row['seconds_per_update']:6.2f} s",
                flush=True,
            )
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "threads": torch.get_num_threads(),
        "engine_weight": ENGINE_WEIGHT,
        "micro_batch_tokens": args.micro_batch_tokens,
        "repeat": args.repeat,
        "batches": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "train_attention_weight.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
