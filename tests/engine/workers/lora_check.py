"""One rank of a LoRA MegatronLM: log-probs with the fresh adapter and with it off, a few optimizer
updates of the adapter, then log-probs again and the whole trained adapter in PEFT's names,
written to --out (rank 0) for tests/engine/test_lora.py to compare with transformers.

Run as `python lora_check.py --rank R --world W --port P --tp T --pp P --model FOLDER --batch B --out O`.
"""

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
    parser.add_argument("--batch", required=True, help="torch.save'd {prompts, responses, advantages}")
    parser.add_argument("--lora", required=True, help="the trainer.lora section as JSON")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    import json
    from pathlib import Path

    from megatron.core import parallel_state as ps

    from kuberl.engine.config.lora import LoRASpec
    from kuberl.engine.config.trainer import OptimizerSpec
    from kuberl.engine.distributed.world import init_model_parallel
    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.models.loading import read_hf_config, read_hf_state_dict
    from kuberl.engine.models.lora_layout import gather_adapter
    from kuberl.engine.training.loss_scale import UpdateTotals
    from kuberl.engine.training.policy import MegatronLM, response_logprobs_from_logits
    from kuberl.engine.training.sequences import MiniBatch, pack

    init_model_parallel(args.tp, args.pp, seed=0)
    folder = Path(args.model)
    arch = LlamaArch.from_hf_config(read_hf_config(folder))
    spec = LoRASpec.model_validate(json.loads(args.lora))
    blob = torch.load(args.batch)
    batch = pack(blob["prompts"], blob["responses"], pad_id=0)
    batch.advantages = blob["advantages"][:, : batch.mask.shape[1]] * batch.mask
    policy = MegatronLM(
        arch, read_hf_state_dict(folder), optimizer=OptimizerSpec(lr=1e-2, grad_clip=1.0), lora=spec, lora_seed=5, packed=True
    )
    base_before = {k: v.clone() for k, v in policy.megatron_state().items()}

    def logprobs() -> torch.Tensor:
        return policy.rows_over_dp(policy.response_logprobs, batch, 2)

    fresh = logprobs()
    with policy.adapters.off():
        base = logprobs()

    def loss_fn(logits, mb, totals: UpdateTotals):
        logp = response_logprobs_from_logits(logits, mb)
        return -(logp * mb.advantages).sum() / mb.mask.sum() * totals.scale(mb, "token_mean"), {}

    stats = [policy.train_plan(batch, [MiniBatch(0, len(batch), 1e-2)], loss_fn, 2)[0] for _ in range(args.updates)]
    trained = logprobs()
    with policy.adapters.off():
        base_after = logprobs()
    frozen = all(torch.equal(v, base_before[k]) for k, v in policy.megatron_state().items())
    # The whole adapter: every (stage, TP rank) of DP replica 0.
    mine = {
        "place": (policy.place.pp_rank, policy.place.tp_rank),
        "dp": policy.place.dp_rank,
        "adapter": policy.adapters.state(),
        "numel": policy.adapters.numel(),
        "optimized": sum(p.numel() for g in policy.optimizer.param_groups for p in g["params"]),
        "trainable": sum(p.numel() for p in policy.module.parameters() if p.requires_grad),
    }
    everything: list = [None] * args.world
    dist.all_gather_object(everything, mine)
    if args.rank == 0:
        shards = {e["place"]: e["adapter"] for e in everything if e["dp"] == 0}
        torch.save(
            {
                "fresh": fresh,
                "base": base,
                "trained": trained,
                "base_after": base_after,
                "mask": batch.mask,
                "frozen": frozen,
                "adapter": gather_adapter(shards, arch, list(spec.target_modules)),
                "shards": shards,
                "grad_norms": [s["grad_norm"] for s in stats],
                "adapter_numel": sum(e["numel"] for e in everything if e["dp"] == 0),
                "optimized": [e["optimized"] for e in everything],
                "trainable": [e["trainable"] for e in everything],
                "dp": ps.get_data_parallel_world_size(),
            },
            args.out,
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
