"""A causal LM (or a critic: the same body with a value head) on megatron-core, as one rank sees it.

It computes per-token log-probs or values of packed sequences through megatron-core's pipeline
schedule, and takes optimizer steps with Megatron's DDP and distributed optimizer. Results of the
last pipeline stage are broadcast to the other stages, so every rank of the model sees them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..config.lora import LoRASpec
from ..config.trainer import OptimizerSpec
from ..models.arch import LlamaArch, UnsupportedModel
from ..models.convert import hf_to_megatron
from .lora import Adapters, attach, is_adapter_name
from .megatron_model import build_gpt_model
from .micro_batch_layers import only_response_positions, rope_at_positions
from .optimizer import load_optimizer_state, megatron_optimizer, optimizer_state
from .segment_attention import use_segments
from .single_dp_rank import skip_identity_collectives
from .loss_scale import UpdateTotals
from .packing import (
    ModelInputs,
    attention_span,
    packed_inputs,
    pad_run,
    padded_inputs,
    positions_per_token,
    shard_by_tokens,
    token_micro_batches,
)
from .sequences import (
    MiniBatch,
    SeqBatch,
    micro_batches,
    on_response_grid,
    pad_rows,
    response_slots,
    response_tokens,
    shard_rows,
)

# loss(output of the last stage at the response tokens, in response_slots order: logits [N, v/tp]
#      or values [N] (sequences.on_response_grid makes them [B, R]),
#      micro-batch, its update's totals) -> (loss scaled to the micro-batch's part of the update, stats)
LossFn = Callable[[torch.Tensor, SeqBatch, UpdateTotals], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class ValueHead(torch.nn.Module):
    """A critic's output layer: hidden state -> one value. Replicated on every TP rank."""

    def __init__(self, hidden: int, dtype: torch.dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden, dtype=dtype))

    def forward(self, hidden_states: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None):
        return F.linear(hidden_states, self.weight), None


def response_logprobs_from_logits(logits: torch.Tensor, batch: SeqBatch) -> torch.Tensor:
    """[B, R] log-prob of each response token (0 outside the mask) from vocab-parallel logits
    [N, v/tp] at the response tokens (the output layer's, in response_slots order)."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    x = logits.float()
    if x is logits:
        # megatron's cross entropy overwrites its input with exp(logits) to save memory; the caller
        # may still need the logits (the entropy term).
        x = x.clone()
    labels = response_tokens(batch)[response_slots(batch)]
    return on_response_grid(-vocab_parallel_cross_entropy(x[:, None], labels[:, None])[:, 0], batch) * batch.mask


def vocab_parallel_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy over a vocabulary split across the TP group; differentiable."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    x = logits.float()
    top = x.max(-1, keepdim=True).values.detach()
    if ps.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    x = x - top
    e = x.exp()
    z = reduce_from_tensor_model_parallel_region(e.sum(-1))
    ex = reduce_from_tensor_model_parallel_region((e * x).sum(-1))
    return z.log() - ex / z


@dataclass(frozen=True)
class ModelPlace:
    tp: int
    pp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    dp_size: int
    ep: int = 1
    """A mixture of experts' expert-parallel size (its ranks are data-parallel ranks of the rest)."""
    ep_rank: int = 0


def model_place() -> ModelPlace:
    from megatron.core import parallel_state as ps

    return ModelPlace(
        ps.get_tensor_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_world_size(),
        ps.get_tensor_model_parallel_rank(),
        ps.get_pipeline_model_parallel_rank(),
        ps.get_data_parallel_rank(),
        ps.get_data_parallel_world_size(),
        ps.get_expert_model_parallel_world_size(),
        ps.get_expert_model_parallel_rank(),
    )


class MegatronLM:
    """One rank's shard of a policy, reference policy or critic."""

    def __init__(
        self,
        arch: LlamaArch,
        hf_state: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        optimizer: OptimizerSpec | None = None,
        value_head: bool = False,
        packed: bool = False,
        share_prefix: bool = False,
        micro_batch_tokens: int | None = None,
        pad_id: int = 0,
        logit_temperature: float = 1.0,
        lora: LoRASpec | None = None,
        lora_seed: int = 0,
    ):
        """packed: each micro-batch as one row of its sequences back to back (packing.py);
        share_prefix: with packed, one copy of a prompt for its consecutive samples;
        micro_batch_tokens: micro-batches by a token budget, and DP shards by tokens;
        logit_temperature: the output layer's logits are divided by it (a policy trained at its
        sampling temperature, RolloutSpec.training_temperature); a critic's values never are;
        lora: freeze the base and train adapters (lora.py), drawn from lora_seed."""
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )

        if lora is not None and arch.is_moe:
            raise UnsupportedModel(f"trainer.lora: {arch.LORA_ON_EXPERTS}")
        self.arch, self.place, self.value_head = arch, model_place(), value_head
        self.packed, self.share_prefix, self.pad_id = packed, share_prefix and packed, pad_id
        self.micro_batch_tokens = micro_batch_tokens if packed else None
        self.span = attention_span(arch)
        self.logit_temperature = 1.0 if value_head else logit_temperature
        place = self.place
        tied = arch.tie_word_embeddings and not value_head
        module = build_gpt_model(arch, tp=place.tp, pp=place.pp, pp_rank=place.pp_rank, dtype=dtype, share_embeddings=tied, ep=place.ep)
        shard = hf_to_megatron(hf_state, arch, place.tp_rank, place.tp, place.pp_rank, place.pp, place.ep_rank, place.ep)
        if value_head:
            shard.pop("output_layer.weight", None)
            if place.pp_rank == place.pp - 1:
                module.output_layer = ValueHead(arch.hidden_size, dtype)
        # The micro-batch being computed, on this rank's device (set by the schedule's forward step):
        # what the layers wrapped below read of its layout.
        self.current: ModelInputs | None = None
        if place.pp_rank == place.pp - 1:
            only_response_positions(module.output_layer, self._current, self.logit_temperature)
        rope_at_positions(module.rotary_pos_emb, self._current)
        for layer in module.decoder.layers:
            use_segments(layer.self_attention.core_attention, lambda: self._current().segments)
        missing, unexpected = module.load_state_dict(shard, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state") and not (value_head and k == "output_layer.weight")]
        if missing or unexpected:
            raise RuntimeError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        module.config.batch_p2p_comm = False  # gloo has no batched isend/irecv
        # Built on the host (use_cpu_initialization); on a GPU machine the shard then moves to this
        # rank's device, where DDP, the optimizer and every micro-batch live.
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        module.to(self.device)
        self.adapters: Adapters | None = (
            None
            if lora is None
            else attach(
                module,
                arch,
                lora,
                tp=place.tp,
                tp_rank=place.tp_rank,
                pp=place.pp,
                pp_rank=place.pp_rank,
                dp_rank=place.dp_rank,
                seed=lora_seed,
            )
        )
        self.trainable = optimizer is not None
        if not self.trainable:
            module.requires_grad_(False)
            self.model, self.module, self.optimizer = module, module, None
            return
        self.model = DistributedDataParallel(
            config=module.config,
            ddp_config=DistributedDataParallelConfig(
                grad_reduce_in_fp32=True, overlap_grad_reduce=False, average_in_collective=True, use_distributed_optimizer=True
            ),
            module=module,
        )
        skip_identity_collectives(self.model)
        self.model.config.no_sync_func = self.model.no_sync
        self.model.config.finalize_model_grads_func = finalize_model_grads
        self.module = module
        self.optimizer = megatron_optimizer(optimizer, self.model, dtype)
        self.optimizer_spec = optimizer

    # -- computing ------------------------------------------------------------------------------

    def _current(self) -> ModelInputs:
        if self.current is None:
            raise RuntimeError("a layer ran outside the schedule's forward step: no micro-batch is being computed")
        return self.current

    def _schedule(
        self,
        batches: list[SeqBatch],
        loss_fn: LossFn,
        forward_only: bool,
        totals: UpdateTotals | None = None,
        inputs: list[ModelInputs] | None = None,
    ) -> list[dict[str, torch.Tensor]]:
        """`inputs`: the micro-batches in this model's layout when the caller built them already."""
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        totals = totals or UpdateTotals.alone(batches)
        inputs = inputs if inputs is not None else self.model_inputs(batches)
        seq, size = inputs[0].input_ids.shape[1], inputs[0].input_ids.shape[0]
        value_head = self.value_head
        device = self.device

        def forward_step(data_iterator, model):
            mb, x = next(data_iterator)
            mb = mb.to(device)
            self.current = x = x.to(device)
            output = model(x.input_ids, x.positions, x.attention_mask, labels=None)
            if ps.is_pipeline_last_stage():
                # [1, N, v/tp] logits or [1, N, 1] values at the response tokens -> [N, v/tp] or [N]
                output = output[0].squeeze(-1) if value_head else output[0]
            return output, lambda out: loss_fn(out, mb, totals)

        results = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(list(zip(batches, inputs))),
            model=[self.model],
            num_microbatches=len(batches),
            seq_length=seq,
            micro_batch_size=size,
            forward_only=forward_only,
        )
        if self.place.pp > 1:
            # Only the last stage computed the results; the other stages of the pipeline get a copy.
            holder = [results if ps.is_pipeline_last_stage() else None]
            last = ps.get_pipeline_model_parallel_last_rank()
            dist.broadcast_object_list(holder, src=last, group=ps.get_pipeline_model_parallel_group())
            results = holder[0]
        return results

    def dp_shard(self, batch: SeqBatch) -> range:
        """This DP rank's rows of `batch`: by tokens under a token budget, else by count."""
        if self.micro_batch_tokens is None:
            return shard_rows(len(batch), self.place.dp_rank, self.place.dp_size)
        tokens = (batch.prompt_lens + batch.response_lens).tolist()
        return shard_by_tokens(tokens, self.place.dp_rank, self.place.dp_size)

    def micro_batches(self, batch: SeqBatch, micro_batch_size: int) -> list[SeqBatch]:
        if self.micro_batch_tokens is None:
            mbs = micro_batches(batch, micro_batch_size)
        else:
            mbs = (
                token_micro_batches(batch, self.micro_batch_tokens, self.share_prefix, self.span)
                if len(batch) or self.place.ep == 1
                else []
            )
        return self._as_many_as_the_expert_group(batch, mbs)

    def _as_many_as_the_expert_group(self, batch: SeqBatch, mbs: list[SeqBatch]) -> list[SeqBatch]:
        """Under expert parallelism each forward's (and backward's) token dispatch is a collective of the ep group,
        whose ranks are data-parallel ranks with rows of their own: every one of them must run as many micro-batches.
        Rows split evenly over dp give as many by count, but not under a token budget: a rank with fewer halves its
        largest micro-batches (each stays within the budget; the totals divide by their number)."""
        if self.place.ep == 1:
            return mbs
        from megatron.core import parallel_state as ps

        count = torch.tensor([len(mbs)], dtype=torch.int64, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=ps.get_expert_model_parallel_group())
        wanted = int(count.item())
        mbs = list(mbs)
        while len(mbs) < wanted:
            largest = max(range(len(mbs)), key=lambda i: len(mbs[i]), default=None)
            if largest is None or len(mbs[largest]) < 2:
                raise RuntimeError(
                    f"expert parallelism (ep={self.place.ep}) runs every micro-batch on all the ranks of "
                    f"an ep group: another rank has {wanted} micro-batches and this one only {len(batch)} "
                    "rows; give each data-parallel rank more rows per update, or use ep=1"
                )
            mb, half = mbs[largest], len(mbs[largest]) // 2
            mbs[largest : largest + 1] = [mb.select(slice(0, half)), mb.select(slice(half, len(mb)))]
        return mbs

    def model_inputs(self, batches: list[SeqBatch]) -> list[ModelInputs]:
        """The micro-batches in this model's layout; under a pipeline all of one shape (the longest)."""
        if not self.packed:
            return [padded_inputs(mb) for mb in batches]
        runs = [packed_inputs(mb, self.share_prefix, span=self.span) for mb in batches]
        if self.place.pp > 1:  # the stages exchange activations of one fixed shape
            length = max(x.tokens for x in runs)
            runs = [pad_run(x, length, self.pad_id) for x in runs]
        return runs

    @torch.no_grad()
    def response_logprobs(self, batches: list[SeqBatch]) -> list[torch.Tensor]:
        """Per micro-batch, [b, R] log-probs of the response tokens (0 outside the mask)."""

        def collect(logits: torch.Tensor, mb: SeqBatch, totals: UpdateTotals):
            return logits.sum() * 0, {"out": response_logprobs_from_logits(logits, mb)}

        self.model.eval()
        return [r["out"].cpu() for r in self._schedule(batches, collect, forward_only=True)]

    @torch.no_grad()
    def response_values(self, batches: list[SeqBatch]) -> list[torch.Tensor]:
        """Critic: per micro-batch, [b, R] value of the state before each response token."""

        def collect(values: torch.Tensor, mb: SeqBatch, totals: UpdateTotals):
            return values.sum() * 0, {"out": on_response_grid(values.float(), mb) * mb.mask}

        self.model.eval()
        return [r["out"].cpu() for r in self._schedule(batches, collect, forward_only=True)]

    @torch.no_grad()
    def response_outputs(self, batches: list[SeqBatch], per_token: Callable[[torch.Tensor, SeqBatch], torch.Tensor]) -> list[torch.Tensor]:
        """Per micro-batch, [b, R] what `per_token` makes of the last stage's output at the response
        tokens (forward only): another statistic of the policy than its log-probs."""

        def collect(output: torch.Tensor, mb: SeqBatch, totals: UpdateTotals):
            return output.sum() * 0, {"out": per_token(output, mb)}

        self.model.eval()
        return [r["out"].cpu() for r in self._schedule(batches, collect, forward_only=True)]

    def accumulate_gradients(
        self, batches: list[SeqBatch], loss_fn: LossFn, totals: UpdateTotals, inputs: list[ModelInputs] | None = None
    ) -> list[dict[str, torch.Tensor]]:
        """Forward and backward over the micro-batches into fresh gradient buffers (reduced over DP
        at the end); returns each micro-batch's stats."""
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        return self._schedule(batches, loss_fn, forward_only=False, totals=totals, inputs=inputs)

    def train_step(self, batches: list[SeqBatch], loss_fn: LossFn, lr: float, totals: UpdateTotals) -> dict[str, float]:
        """One optimizer update over the micro-batches; `totals`: the whole mini-batch's divisors
        (loss_scale.py), so the update is the same however the mini-batch was cut. The stats hold
        the seconds of its two parts (`backward_seconds`: forward + backward, `optimizer_seconds`) and
        what the model computed (`train_positions`; `train_positions_per_token`: per token of the
        sequences, above 1 with padding, below with shared prompts; `train_tokens_per_second`)."""
        assert self.optimizer is not None, "a frozen model cannot train"
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        inputs = self.model_inputs(batches)
        if self.arch.is_moe:
            _clear_moe_losses()
        results = self.accumulate_gradients(batches, loss_fn, totals, inputs)
        middle = time.perf_counter()
        ok, grad_norm, _ = self.optimizer.step()
        stats = _mean_stats(results)
        if self.arch.is_moe:
            stats.update(_moe_losses(len(batches)))
        stats["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
        stats["update_skipped"] = 0.0 if ok else 1.0
        stats["backward_seconds"], stats["optimizer_seconds"] = middle - started, time.perf_counter() - middle
        stats.update(_computed(batches, inputs, stats["backward_seconds"]))
        return stats

    def rows_over_dp(self, compute: Callable[[list[SeqBatch]], list[torch.Tensor]], batch: SeqBatch, micro_batch_size: int) -> torch.Tensor:
        """Run `compute` (a per-micro-batch forward) on this DP rank's rows; every rank gets all rows."""
        from megatron.core import parallel_state as ps

        mine = batch.select(self.dp_shard(batch))
        mbs = self.micro_batches(mine, micro_batch_size) if len(mine) or self.place.ep > 1 else []
        if mbs and self.place.pp > 1:  # every pipeline micro-batch has the same shape
            mbs[-1] = pad_rows(mbs[-1], micro_batch_size)
        parts = compute(mbs)
        local = torch.cat(parts)[: len(mine)] if parts else torch.zeros(0, batch.mask.shape[1])
        gathered: list = [None] * self.place.dp_size
        dist.all_gather_object(gathered, local, group=ps.get_data_parallel_group())
        return torch.cat(gathered)

    def train_plan(self, batch: SeqBatch, plan: list[MiniBatch], loss_fn: LossFn, micro_batch_size: int) -> list[dict[str, float]]:
        """One update per mini-batch of `batch`, each split over DP."""
        stats = []
        for update in plan:
            mini = batch.select(slice(update.start, update.end))
            mine = mini.select(self.dp_shard(mini))
            mbs = self.micro_batches(mine, micro_batch_size)
            totals = UpdateTotals.of(mini, len(mbs), self.place.dp_size)
            stats.append(self.train_step(mbs, loss_fn, update.lr, totals))
        return stats

    # -- device memory around rollout ------------------------------------------------------------

    def offload(self) -> int:
        """GPU: move the optimizer state (main parameters, Adam moments) to host memory and free the
        gradient buffers while vLLM generates; returns the device bytes freed (0 on CPU, or frozen)."""
        if self.optimizer is None or not torch.cuda.is_available():
            return 0
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        self.optimizer.offload_to_cpu()
        self.model.offload_grad_buffers(synchronize=True, empty_cache=True)
        return max(0, before - torch.cuda.memory_allocated())

    def onload(self) -> None:
        """GPU: bring back what `offload` moved, before the next training step."""
        if self.optimizer is None or not torch.cuda.is_available():
            return
        self.optimizer.restore_from_cpu()
        self.model.restore_grad_buffers(synchronize=True)

    # -- state ----------------------------------------------------------------------------------

    def megatron_state(self) -> dict[str, torch.Tensor]:
        """This rank's base weights by Megatron name (what the hybrid engine streams), adapters aside."""
        return {k: v for k, v in self.module.state_dict().items() if not k.endswith("_extra_state") and not is_adapter_name(k)}

    def state_dict(self) -> dict[str, Any]:
        """With LoRA, the adapter alone: the base is the model's own folder, frozen."""
        state: dict[str, Any] = (
            {"model": self.megatron_state()}
            if self.adapters is None
            else {"adapter": self.adapters.state(), "dropout_rng": self.adapters.generator.get_state()}
        )
        if self.optimizer is not None:
            state["optimizer"] = optimizer_state(self.optimizer)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.adapters is not None:
            self.adapters.load(state["adapter"])
            self.adapters.generator.set_state(state["dropout_rng"])
        else:
            self._load_weights(state)
        if self.optimizer is not None:
            load_optimizer_state(self.optimizer, state["optimizer"])

    def _load_weights(self, state: Mapping[str, Any]) -> None:
        with torch.no_grad():
            missing, unexpected = self.module.load_state_dict(state["model"], strict=False)
        if unexpected or [k for k in missing if not k.endswith("_extra_state")]:
            raise RuntimeError(f"checkpoint does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


MOE_LOSSES = {"load_balancing_loss": "moe_aux_loss"}
"""megatron-core's router losses (its aux-loss tracker's names) and the step metrics that report them."""


def _clear_moe_losses() -> None:
    from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker

    clear_aux_losses_tracker()


def _moe_losses(num_micro_batches: int) -> dict[str, float]:
    """The router's load-balancing loss of the update just computed, as megatron-core's training loop reports it:
    per MoE layer, summed over the micro-batches' forwards and divided by their number, averaged over the layers and
    the data-parallel ranks (its coefficient left out; megatron's router added coefficient x this loss's gradient in
    the backward). A collective over the pipeline and data-parallel groups; none where the coefficient is 0."""
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker, reduce_aux_losses_tracker_across_ranks

    tracker = get_moe_layer_wise_logging_tracker()
    names = [name for name in MOE_LOSSES if name in tracker]
    if not names:
        return {}
    reduce_aux_losses_tracker_across_ranks(names)
    return {MOE_LOSSES[name]: float(tracker[name]["values"].float().mean()) / max(1, num_micro_batches) for name in names}


def _computed(batches: list[SeqBatch], inputs: list[ModelInputs], seconds: float) -> dict[str, float]:
    """What an update's layout made the model compute, and how fast."""
    positions = float(sum(x.tokens for x in inputs))
    return {
        "train_positions": positions,
        "train_positions_per_token": positions_per_token(batches, inputs),
        "train_tokens_per_second": positions / max(seconds, 1e-9),
    }


def _mean_stats(results: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    if not results:
        return {}
    keys = results[0].keys()
    return {k: float(torch.stack([torch.as_tensor(r[k]).float() for r in results]).mean()) for k in keys}
