"""One rank (or several, --tp) of MegatronLM on a Hugging Face folder: response log-probs, entropy and
values of a packed batch, written to --out for tests/rl/test_policy.py to compare with transformers."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", required=True, help="torch.save'd {prompts, responses}")
    parser.add_argument("--out", required=True)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    from pathlib import Path

    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.models.loading import read_hf_config, read_hf_state_dict
    from kuberl.engine.training.policy import (
        MegatronLM,
        response_logprobs_from_logits,
        vocab_parallel_entropy,
    )
    from kuberl.engine.training.sequences import micro_batches, on_response_grid, pack
    from kuberl.engine.distributed.world import init_model_parallel

    init_model_parallel(args.tp, args.pp, seed=0)
    folder = Path(args.model)
    arch = LlamaArch.from_hf_config(read_hf_config(folder))
    state = read_hf_state_dict(folder)
    blob = torch.load(args.batch)
    batch = pack(blob["prompts"], blob["responses"], pad_id=0)
    policy = MegatronLM(arch, state, optimizer=None, logit_temperature=args.temperature)
    logprobs = torch.cat(policy.response_logprobs(micro_batches(batch, 2)))
    # The loss path: entropy and log-probs from the same logits, entropy first read after the cross entropy.
    seen = {}

    def loss_fn(logits, mb, totals):
        lp = response_logprobs_from_logits(logits, mb)
        ent = on_response_grid(vocab_parallel_entropy(logits), mb) * mb.mask
        seen.setdefault("entropy", []).append(ent.detach())
        seen.setdefault("logprobs", []).append(lp.detach())
        return lp.sum() * 0, {}

    policy._schedule(micro_batches(batch, 2), loss_fn, forward_only=True)
    critic = MegatronLM(arch, state, optimizer=None, value_head=True, logit_temperature=args.temperature)
    values = torch.cat(critic.response_values(micro_batches(batch, 2)))
    if args.rank == 0:
        torch.save(
            {
                "logprobs": logprobs,
                "loss_logprobs": torch.cat(seen.get("logprobs", [torch.zeros(0)])),
                "entropy": torch.cat(seen.get("entropy", [torch.zeros(0)])),
                "values": values,
                "mask": batch.mask,
            },
            args.out,
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
