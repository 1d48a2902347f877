"""One rank of a training->generation switch over gloo; writes what it gathered and counted to --out.

Each rank holds its Megatron shard of a Hugging Face model (layout tp x pp x dp over the world) and
streams its generation shard (--tg 1: the whole model) through the Resharder, bucket by bucket, as
vLLM would consume it.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--rank", "--world", "--port", "--tp", "--pp", "--tg", "--bucket-bytes"):
        parser.add_argument(flag, type=int, required=flag in ("--rank", "--world", "--port"), default=1)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--naive", action="store_true", help="baseline: all-gather every shard to every rank of the world")
    parser.add_argument("--with-naive", action="store_true", help="after the switch, also count the baseline's bytes")
    parser.add_argument("--vllm-folder", help="start vLLM from this (different) model and stream the switch into it")
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    from kuberl.engine.compat import megatron_cpu

    megatron_cpu.apply()
    from megatron.core import parallel_state as ps

    from kuberl.engine.hybrid.reshard import Resharder
    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.models.convert import hf_to_megatron

    from kuberl.engine.distributed.world import init_model_parallel

    init_model_parallel(args.tp, args.pp, seed=1234)
    blob = torch.load(args.model, weights_only=False)
    arch = LlamaArch.from_hf_config(blob["hf_config"])
    stage, tp_rank = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
    local = hf_to_megatron(blob["state_dict"], arch, tp_rank, args.tp, stage, args.pp)
    group = ps.get_model_parallel_group()
    members = [None] * dist.get_world_size(group)
    dist.all_gather_object(members, (stage, tp_rank, args.rank), group=group)
    ranks = {(s, t): r for s, t, r in members}

    if args.vllm_folder:
        rollout = check_vllm(args, arch, stage, tp_rank, ranks, group, blob)
        dist.barrier()
        # vLLM tears the process group down itself when its engine goes away.
        del rollout
        return
    dist.barrier()
    if args.naive:
        gathered, stats = naive(local, args.world)
    else:
        resharder = Resharder(arch, args.tp, args.pp, stage, tp_rank, ranks, group, bucket_bytes=args.bucket_bytes, tg=args.tg)
        # The generation shard vLLM's TP rank (rank % tg) needs: chunk of the split dimension, or the whole tensor.
        gathered = {name: (shard, dim) for name, shard, dim in resharder.stream_shards(local)}
        stats = resharder.stats.history[-1] | {"buckets": resharder.stats.buckets}
        if args.with_naive:  # the baseline in the same processes: one start-up instead of two
            dist.barrier()
            stats["naive_bytes_received"] = naive(local, args.world)[1]["bytes_received"]
    dist.barrier()
    expected = {k: v for k, v in blob["state_dict"].items() if not (arch.tie_word_embeddings and k == "lm_head.weight")}
    j = args.rank % args.tg

    def shard_of(tensor, dim):
        return tensor if dim is None else tensor.chunk(args.tg, dim)[j]

    exact = (
        (not args.naive)
        and set(gathered) == set(expected)
        and all(torch.equal(gathered[k][0], shard_of(v, gathered[k][1])) for k, v in expected.items())
    )
    torch.save({"rank": args.rank, "stage": stage, "tp": tp_rank, "exact": exact, **stats}, f"{args.out}.{args.rank}")
    dist.barrier()
    dist.destroy_process_group()


def check_vllm(args, arch, stage, tp_rank, ranks, group, blob) -> None:
    """Every rank runs a vLLM replica that starts from other weights; two switches stream the
    training weights in, the second after one step of Megatron's distributed Adam on every rank.
    Each time, vLLM's greedy completions must carry the log-probabilities that transformers gives
    with the weights just sent, and after the step those weights must differ from the first ones."""
    import transformers

    from kuberl.engine.config.trainer import OptimizerSpec
    from kuberl.engine.hybrid.reshard import Resharder
    from kuberl.engine.rollout.vllm_backend import Sampling, VLLMRollout
    from kuberl.engine.training.loss_scale import UpdateTotals
    from kuberl.engine.training.policy import MegatronLM, response_logprobs_from_logits
    from kuberl.engine.training.sequences import micro_batches, pack

    rollout = VLLMRollout(
        args.vllm_folder, kv_cache_bytes=64 << 20, max_model_len=128, skip_tokenizer_init=True, tensor_parallel_size=args.tg
    )
    prompts = [[1, 2, 3, 4, 5], [7, 7, 9], [100, 50, 25, 12]]
    greedy = Sampling(max_new_tokens=8, temperature=0.0)
    resharder = Resharder(arch, args.tp, args.pp, stage, tp_rank, ranks, group, bucket_bytes=args.bucket_bytes, tg=args.tg)
    # With tg > 1 the switch sends each rank only its shard; the full weights transformers checks
    # against come from a second, whole-model gather.
    whole = Resharder(arch, args.tp, args.pp, stage, tp_rank, ranks, group) if args.tg > 1 else None
    policy = MegatronLM(arch, blob["state_dict"], optimizer=OptimizerSpec(lr=5e-2, grad_clip=0.0))
    hf_config = transformers.AutoConfig.for_model(**blob["hf_config"])  # the family its model_type names
    hf = transformers.AutoModelForCausalLM.from_config(hf_config).float().eval()
    report = {"rank": args.rank, "rounds": []}
    sent_before, completions = None, []
    for round_ in range(2):
        if round_ == 1:
            # A real update: raise the log-probability of the first round's greedy answers.
            batch = pack(prompts, [c.token_ids[::-1] for c in completions], pad_id=0)
            mbs = micro_batches(batch, 3)
            stats = policy.train_step(
                mbs,
                lambda logits, mb, totals: (-(response_logprobs_from_logits(logits, mb).sum() / mb.mask.sum()), {}),
                lr=5e-2,
                totals=UpdateTotals.alone(mbs),
            )
            report["grad_norm"] = stats["grad_norm"]
        sent: dict = {}

        def recorded(stream):
            for name, tensor in stream:
                sent[name] = tensor.clone()
                yield name, tensor

        if whole is None:
            loaded = rollout.update_weights(recorded(resharder.stream(policy.megatron_state())))
        else:
            loaded = rollout.update_weights(resharder.stream(policy.megatron_state()))
            sent = {name: tensor.clone() for name, tensor in whole.stream(policy.megatron_state())}  # norms alias live parameters
        completions = rollout.generate(prompts, greedy)
        hf.load_state_dict(sent)
        worst = 0.0
        for prompt, completion in zip(prompts, completions):
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + completion.token_ids])).logits[0, len(prompt) - 1 : -1]
            logprobs = torch.log_softmax(logits, -1)
            chosen = logprobs.gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0]
            worst = max(
                worst, (chosen - torch.tensor(completion.logprobs)).abs().max().item(), (logprobs.max(-1).values - chosen).max().item()
            )
        moved = None if sent_before is None else sum(not torch.equal(sent[k], sent_before[k]) for k in sent)
        report["rounds"].append(
            {
                "tokens": [c.token_ids for c in completions],
                "worst": worst,
                "loaded": loaded,
                "bytes_received": resharder.stats.bytes_received,
                "stage": stage,
                "tp": tp_rank,
                "tensors_moved": moved,
                "tensors": len(sent),
                "first_round_equals_blob": round_ > 0 or all(torch.equal(sent[k], blob["state_dict"][k]) for k in sent),
            }
        )
        sent_before = sent
    torch.save(report, f"{args.out}.{args.rank}")
    return rollout


def naive(local: dict, world: int) -> tuple[dict, dict]:
    """The baseline switch (kuberl.engine.hybrid.baseline), timed."""
    import time

    from kuberl.engine.hybrid.baseline import naive_all_gather

    started = time.perf_counter()
    received = naive_all_gather(local, world)
    return {}, {"bytes_received": received, "seconds": time.perf_counter() - started}


if __name__ == "__main__":
    main()
