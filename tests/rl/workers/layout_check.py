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
    from kuberl.engine.training.policy import MegatronLM, response_logprobs_from_logits
    from kuberl.engine.training.sequences import micro_batches, pack
    from kuberl.engine.distributed.world import init_model_parallel

    init_model_parallel(args.tp, args.pp, seed=0)
    folder = Path(args.model)
    blob = torch.load(args.batch)
    batch = pack(blob["prompts"], blob["responses"], pad_id=0)
    weights = torch.Generator().manual_seed(1)
    batch.advantages = torch.randn(batch.mask.shape, generator=weights) * batch.mask
    policy = MegatronLM(LlamaArch.from_hf_config(read_hf_config(folder)), read_hf_state_dict(folder), optimizer=OptimizerSpec(lr=1e-3))

    def loss_fn(logits, mb, totals):
        logp = response_logprobs_from_logits(logits, mb)
        return -(logp * mb.advantages).sum() / mb.mask.sum(), {}

    out = {}
    span = policy.span
    # shared_split: a span so short that runs split into rows of fewer samples (packing._split_run).
    for name, packed, shared, row_span in (
        ("padded", False, False, span),
        ("packed", True, False, span),
        ("shared", True, True, span),
        ("shared_split", True, True, 0.5),
    ):
        policy.packed, policy.share_prefix, policy.span = packed, shared, row_span
        mbs = micro_batches(batch, blob["micro_batch_size"])
        logprobs = torch.cat(policy.response_logprobs(mbs))
        policy.model.train()
        policy.model.zero_grad_buffer()
        policy._schedule(mbs, loss_fn, forward_only=False)
        grads = {n: p.main_grad.detach().clone() for n, p in policy.model.module.named_parameters()}
        inputs = policy.model_inputs(mbs)
        out[name] = {
            "logprobs": logprobs,
            "grads": grads,
            "tokens": sum(x.tokens for x in inputs),
            "blocks": sum(x.attention_blocks for x in inputs),
        }
    policy.span = span
    out["mask"] = batch.mask
    out["splits"] = split_gradients(policy, batch)
    torch.save(out, f"{args.out}-{args.rank}")
    dist.barrier()
    dist.destroy_process_group()


def reduced_gradients(policy) -> dict[str, torch.Tensor]:
    """Every parameter's gradient reduced over DP. The distributed optimizer reduce-scatters: a
    rank's gradient buffer holds the reduced values only in its own shard of each bucket, so the
    shards are gathered back first."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed.param_and_grad_buffer import shard_buffer

    group, dp, rank = ps.get_data_parallel_group(), ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    if dp > 1:
        for buffer in policy.model.buffers:
            for bucket in buffer.buckets:
                shards = shard_buffer(bucket.grad_data, dp)
                gathered = [torch.empty_like(s) for s in shards]
                dist.all_gather(gathered, shards[rank].clone(), group=group)
                for shard, full in zip(shards, gathered):
                    shard.copy_(full)
    return {n: p.main_grad.detach().clone() for n, p in policy.model.module.named_parameters()}


def split_gradients(policy, batch) -> dict:
    """Per loss aggregation, every parameter's gradient of the real policy loss (GRPO's clipped
    surrogate, a KL and an entropy term) with the batch cut in several ways: the whole batch in one
    micro-batch on every rank (the reference), and this rank's DP shard in micro-batches of one
    sequence, of two, and by a token budget."""
    from kuberl.engine.config.algorithm import AlgorithmSpec
    from kuberl.engine.training.loss_scale import UpdateTotals
    from kuberl.engine.training.losses import policy_loss_fn

    noise = torch.Generator().manual_seed(2)
    with torch.no_grad():
        logprobs = torch.cat(policy.response_logprobs([batch]))
    batch.old_logprobs = (logprobs + 0.1 * torch.randn(batch.mask.shape, generator=noise)) * batch.mask
    batch.ref_logprobs = (logprobs + 0.1 * torch.randn(batch.mask.shape, generator=noise)) * batch.mask
    policy.packed, policy.share_prefix = True, True
    dp = policy.place.dp_size
    out: dict = {}
    for aggregation in ("token_mean", "token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        algorithm = AlgorithmSpec.model_validate({"name": "grpo", "lossAggregation": aggregation, "klCoef": 0.1, "entropyCoef": 0.01})
        loss = policy_loss_fn(algorithm, horizon=8)
        cuts = {}
        for cut, budget, size in (("whole", None, None), ("one", None, 1), ("two", None, 2), ("tokens", 12, None)):
            policy.micro_batch_tokens = budget
            if size is None and budget is None:  # every DP rank the same: their mean is one copy
                mbs = [batch]
                totals = UpdateTotals.of(batch, 1, dp=1)
            else:
                mine = batch.select(policy.dp_shard(batch))
                mbs = policy.micro_batches(mine, size or 1)
                totals = UpdateTotals.of(batch, len(mbs), dp)
            policy.accumulate_gradients(mbs, loss, totals)
            cuts[cut] = reduced_gradients(policy)
        policy.micro_batch_tokens = None
        out[aggregation] = cuts
    return out


if __name__ == "__main__":
    main()
