"""The GPU check for a lent machine (one prepared run, a few minutes): what CPU tests cannot show.

1. a bf16 TP=1 training step of SmolLM2 on megatron-core (forward, backward, AdamW step);
2. vLLM (PyPI's CUDA build) generation in the same process;
3. a weight update from the trained model into vLLM, and the completions changing;
4. vLLM sleep and wake, with the device memory it frees (torch.cuda.mem_get_info before and after);
5. the RL loop's MegatronLM (DDP, distributed optimizer, bf16): a step, its optimizer state and
   gradients off the device and back (memory_allocated before and after), and a second step.
Prints one JSON object; exit status 1 if any check fails.

    python bench/gpu_check.py
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import torch


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 1
    from kuberl.engine.models.arch import LlamaArch
    from kuberl.engine.models.convert import hf_to_megatron, megatron_to_hf
    from kuberl.engine.models.loading import gguf_to_hf_folder, read_hf_config, read_hf_state_dict, smollm2_gguf
    from kuberl.engine.rollout.vllm_backend import Sampling, VLLMRollout

    report: dict = {"device": torch.cuda.get_device_name(0)}
    folder = gguf_to_hf_folder(smollm2_gguf())
    prompts = [[1, 9690, 198, 2683, 314, 216, 33, 34, 1232, 216, 39, 47, 2, 198, 1, 520, 9531, 198]] * 4

    # vLLM first: it sets up torch.distributed for its one-rank world, which Megatron then reuses.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    started = time.perf_counter()
    rollout = VLLMRollout(folder, dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=1024)
    report["vllm_start_seconds"] = round(time.perf_counter() - started, 1)
    greedy = Sampling(max_new_tokens=32, temperature=0.0)
    before = rollout.generate(prompts, greedy)
    report["vllm_generated_tokens"] = sum(len(c.token_ids) for c in before)

    # A bf16 training step on megatron-core, TP=1.
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from kuberl.engine.training.megatron_model import build_gpt_model, causal_mask

    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    arch = LlamaArch.from_hf_config(read_hf_config(folder))
    model = build_gpt_model(arch, dtype=torch.bfloat16).cuda()
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in hf_to_megatron(read_hf_state_dict(folder), arch).items()}, strict=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, arch.vocab_size, (8, 256), device="cuda")
    positions = torch.arange(256, device="cuda").unsqueeze(0).expand(8, 256)
    torch.cuda.synchronize()
    started = time.perf_counter()
    losses = model(ids, positions, causal_mask(256, "cuda"), labels=torch.roll(ids, -1, 1))
    loss = losses.float().mean()
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    report["train_step_seconds"] = round(time.perf_counter() - started, 3)
    report["train_loss"] = round(loss.item(), 4)
    report["train_memory_allocated_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)

    # Weight update: the trained weights stream into vLLM, and the completions change.
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    hf = megatron_to_hf({(0, 0): state}, arch)
    started = time.perf_counter()
    report["update_bytes"] = rollout.update_weights(iter(hf.items()))
    report["update_seconds"] = round(time.perf_counter() - started, 3)
    after = rollout.generate(prompts, greedy)
    report["completions_changed"] = any(a.token_ids != b.token_ids for a, b in zip(after, before))

    # Sleep frees the KV cache (and weights at level 1 go to host memory); wake restores them.
    free_before, _ = torch.cuda.mem_get_info()
    rollout.sleep()
    free_asleep, _ = torch.cuda.mem_get_info()
    rollout.wake_up()
    free_awake, _ = torch.cuda.mem_get_info()
    report["sleep_freed_gib"] = round((free_asleep - free_before) / 2**30, 2)
    report["wake_reclaimed_gib"] = round((free_asleep - free_awake) / 2**30, 2)
    again = rollout.generate(prompts, greedy)
    report["same_after_wake"] = [c.token_ids for c in again] == [c.token_ids for c in after]

    # The trainer's side of the hybrid engine: Megatron DDP + distributed optimizer (the RL loop's
    # MegatronLM) moves its optimizer state and gradient buffers off the device for rollout.
    from kuberl.engine.config.trainer import OptimizerSpec
    from kuberl.engine.runtime.policy import MegatronLM, response_logprobs_from_logits
    from kuberl.engine.runtime.sequences import micro_batches, pack

    del model, optimizer, losses, loss
    torch.cuda.empty_cache()
    lm = MegatronLM(arch, read_hf_state_dict(folder), dtype=torch.bfloat16, optimizer=OptimizerSpec.model_validate({"lr": 1e-5}))
    batch = pack(prompts, [c.token_ids for c in after], pad_id=0)

    def nll(logits, mb):
        logp = response_logprobs_from_logits(logits, mb)
        return -(logp.sum() / mb.mask.sum()), {}

    first = lm.train_step(micro_batches(batch, 4), nll, 1e-5)
    held = torch.cuda.memory_allocated()
    report["offload_freed_gib"] = round(lm.offload() / 2**30, 3)
    report["offload_allocated_gib_before_after"] = [round(held / 2**30, 3), round(torch.cuda.memory_allocated() / 2**30, 3)]
    started = time.perf_counter()
    lm.onload()
    report["onload_seconds"] = round(time.perf_counter() - started, 3)
    second = lm.train_step(micro_batches(batch, 4), nll, 1e-5)
    report["train_after_onload"] = {"grad_norm_first": round(first["grad_norm"], 4), "grad_norm_second": round(second["grad_norm"], 4)}
    offload_ok = report["offload_freed_gib"] > 0.1 and all(math.isfinite(x["grad_norm"]) for x in (first, second))

    ok = report["completions_changed"] and report["sleep_freed_gib"] > 0.5 and report["same_after_wake"] and offload_ok
    report["ok"] = bool(ok)
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
