"""One rank of MegatronLM computing a batch's response log-probs, a loss and every parameter's
gradient in each micro-batch layout (padded, packed, packed with shared prompts), written to
--out-<rank> for tests/rl/test_packing.py to compare."""

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
    parser.add_argument("--batch", required=True, help="torch.save'd {prompts, responses, micro_batch_size}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    from pathlib import Path

    from kuberl.engine.config.trainer import OptimizerSpec
    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.models.loading import read_hf_config, read_hf_state_dict
    from kuberl.engine.runtime.policy import MegatronLM, response_logprobs_from_logits
    from kuberl.engine.runtime.sequences import micro_batches, pack
    from kuberl.engine.runtime.world import init_model_parallel

    init_model_parallel(args.tp, args.pp, seed=0)
    folder = Path(args.model)
    blob = torch.load(args.batch)
    batch = pack(blob["prompts"], blob["responses"], pad_id=0)
    weights = torch.Generator().manual_seed(1)
    batch.advantages = torch.randn(batch.mask.shape, generator=weights) * batch.mask
    policy = MegatronLM(LlamaArch.from_hf_config(read_hf_config(folder)), read_hf_state_dict(folder),
                        optimizer=OptimizerSpec(lr=1e-3))

    def loss_fn(logits, mb):
        logp = response_logprobs_from_logits(logits, mb)
        return -(logp * mb.advantages).sum() / mb.mask.sum(), {}

    out = {}
    for name, packed, shared in (("padded", False, False), ("packed", True, False), ("shared", True, True)):
        policy.packed, policy.share_prefix = packed, shared
        mbs = micro_batches(batch, blob["micro_batch_size"])
        logprobs = torch.cat(policy.response_logprobs(mbs))
        policy.model.train()
        policy.model.zero_grad_buffer()
        policy._schedule(mbs, loss_fn, forward_only=False)
        grads = {n: p.main_grad.detach().clone() for n, p in policy.model.module.named_parameters()}
        out[name] = {"logprobs": logprobs, "grads": grads, "tokens": sum(x.tokens for x in policy.model_inputs(mbs))}
    out["mask"] = batch.mask
    torch.save(out, f"{args.out}-{args.rank}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
