"""One rank of a megatron-core forward/backward over gloo; writes what it computed to --out.

Run by tests/engine/test_megatron.py as `python megatron_forward.py --rank R --world W --port P ...`.
Every rank builds its (TP, PP) shard from the same Hugging Face state dict, runs the same batch,
and reports its logits (last stage), the loss and its parameters' gradients in Hugging Face names.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1, help="expert parallelism (mixture-of-experts models), folded into dp")
    parser.add_argument("--dp-wrap", action="store_true", help="wrap in Megatron's DistributedDataParallel")
    parser.add_argument(
        "--optimizer-step",
        action="store_true",
        help="after the backward pass take one step of Megatron's distributed Adam and report the weights",
    )
    parser.add_argument("--model", required=True, help="a torch.save'd dict: input_ids, and hf_config and state_dict unless --hf-folder")
    parser.add_argument("--hf-folder", help="read the config and weights from this Hugging Face folder instead")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)

    from kuberl.engine.compat import megatron_cpu

    megatron_cpu.apply()
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.models.convert import hf_to_megatron, megatron_to_hf
    from kuberl.engine.training.megatron_model import PADDED_LOGIT, build_gpt_model, causal_mask

    ps.initialize_model_parallel(
        tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp, expert_model_parallel_size=args.ep
    )
    model_parallel_cuda_manual_seed(1234)
    blob = torch.load(args.model, weights_only=False)
    if args.hf_folder:
        from pathlib import Path

        from kuberl.engine.models.loading import read_hf_config, read_hf_state_dict

        blob["hf_config"] = read_hf_config(Path(args.hf_folder))
        blob["state_dict"] = read_hf_state_dict(Path(args.hf_folder))
    arch = LlamaArch.from_hf_config(blob["hf_config"])
    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    ep_rank = ps.get_expert_model_parallel_rank()
    model = build_gpt_model(arch, tp=args.tp, pp=args.pp, pp_rank=pp_rank, ep=args.ep)
    missing, unexpected = model.load_state_dict(
        hf_to_megatron(blob["state_dict"], arch, tp_rank, args.tp, pp_rank, args.pp, ep_rank, args.ep), strict=False
    )
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)

    if args.dp_wrap or args.optimizer_step:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

        model = DistributedDataParallel(
            config=model.config,
            ddp_config=DistributedDataParallelConfig(
                grad_reduce_in_fp32=True,
                overlap_grad_reduce=False,
                average_in_collective=True,
                use_distributed_optimizer=args.optimizer_step,
            ),
            module=model,
        )
        model.config.no_sync_func = model.no_sync
        model.config.finalize_model_grads_func = finalize_model_grads
    # Data parallel: each DP rank takes its slice of the batch.
    dp_rank, dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    ids = blob["input_ids"].chunk(dp_size, dim=0)[dp_rank]
    batch, seq = ids.shape
    positions = torch.arange(seq).unsqueeze(0).expand(batch, seq)
    if "position_ids" in blob:  # positions far into a long context, without the long sequence
        positions = blob["position_ids"].chunk(dp_size, dim=0)[dp_rank]
    labels = torch.roll(ids, -1, dims=1)
    captured = {}

    def loss_func(output):
        loss = output.float().mean()
        return loss, {"loss": loss.detach()}

    def forward_step(data_iterator, model):
        logits = model(ids, positions, causal_mask(seq), labels=None)
        if ps.is_pipeline_last_stage():
            from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region, vocab_parallel_cross_entropy

            full = gather_from_tensor_model_parallel_region(logits).detach().clone()
            # A vocabulary tp does not divide is padded: the padding ids' logits are masked, and not the model's.
            assert (full[..., arch.vocab_size :] == PADDED_LOGIT).all(), "the padded vocabulary's logits are not masked"
            captured["logits"] = full[..., : arch.vocab_size].contiguous()
            losses = vocab_parallel_cross_entropy(logits.float().transpose(0, 1).contiguous(), labels.transpose(0, 1).contiguous())
            return losses, loss_func
        return logits, loss_func

    config = model.config
    config.batch_p2p_comm = False  # gloo has no batched isend/irecv
    forward_backward = get_forward_backward_func()
    results = forward_backward(
        forward_step_func=forward_step,
        data_iterator=iter([None]),
        model=[model],
        num_microbatches=1,
        seq_length=seq,
        micro_batch_size=batch,
        forward_only=False,
    )
    wrapped = args.dp_wrap or args.optimizer_step
    module = model.module if wrapped else model
    grads = {
        name: (p.main_grad if wrapped else p.grad).detach().clone()
        for name, p in module.named_parameters()
        if (p.main_grad if wrapped else p.grad) is not None
    }
    if args.optimizer_step:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=1e-2,
                weight_decay=0.0,
                adam_beta1=0.9,
                adam_beta2=0.999,
                adam_eps=1e-8,
                clip_grad=1.0,
                use_distributed_optimizer=True,
            ),
            [model],
        )
        success, grad_norm, _ = optimizer.step()
        assert success
        # Report the stepped weights where the gradients were: the same gather and conversion.
        grads = {name: p.detach().clone() for name, p in module.named_parameters()}
        captured["grad_norm"] = float(grad_norm)
    mine = {
        "pp": pp_rank,
        "tp": tp_rank,
        "dp": dp_rank,
        "ep": ep_rank,
        "edp": ps.get_expert_data_parallel_rank(),
        "grads": grads,
        "logits": captured.get("logits"),
        "grad_norm": captured.get("grad_norm"),
        "loss": results[0]["loss"] if results else None,
    }
    everything = [None] * args.world
    dist.all_gather_object(everything, mine)
    if args.rank == 0:
        # Logits and loss of the whole batch: every DP rank's share, in order.
        last = sorted((e for e in everything if e["logits"] is not None and e["tp"] == 0), key=lambda e: e["dp"])
        logits = torch.cat([e["logits"] for e in last], dim=1 if last[0]["logits"].shape[0] == seq else 0)
        loss = torch.stack([e["loss"] for e in last]).mean()
        # DP replicas hold the same (averaged) gradients; under ep the experts differ between the DP ranks of an
        # expert-parallel group: keep every (pp, tp, ep) shard of expert-data-parallel rank 0.
        everything = [e for e in everything if (e["edp"] == 0 if args.ep > 1 else e["dp"] == 0)]
        shards = {(e["pp"], e["tp"], e["ep"]): e["grads"] for e in everything}
        if arch.tie_word_embeddings and args.pp > 1:
            # Tied weights live on the first and the last stage; their gradients add up.
            for tp in range(args.tp):
                shards[(0, tp, 0)]["embedding.word_embeddings.weight"] += shards[(args.pp - 1, tp, 0)].pop("output_layer.weight")
        torch.save(
            {"hf_grads": megatron_to_hf(shards, arch), "logits": logits, "loss": loss, "grad_norm": everything[0]["grad_norm"]}, args.out
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
