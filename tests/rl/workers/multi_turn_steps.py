"""One rank of a multi-turn job that runs one real step of each algorithm given (started and stepped
by algorithm_steps.py's start and take_steps) and records what a metric cannot show: the advantage estimators
the step called, and each trajectory of the batch it trained on, split by the loss mask of its packed
row (the tokens the loss reads and those it does not) next to its conversation. Started like
`kuberl run` starts its ranks; rank 0 writes one JSON record per step to --out."""

from __future__ import annotations

from itertools import groupby

from algorithm_steps import start, take_steps  # this folder is the script's sys.path[0]


def runs(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Maximal runs of equal mask: (mask, ids)."""
    return [(m, [token for token, _ in run]) for m, run in groupby(zip(ids, mask), key=lambda pair: pair[1])]


def main() -> None:
    args, run, specs = start()
    import kuberl.engine.algorithms as A
    from kuberl.engine.steps.training_ops import TrainingOps

    tokenizer = run.tokenizer
    called: list[str] = []
    lookup = A.advantage_estimator

    def advantage_estimator(name: str):
        called.append(name)
        return lookup(name)

    A.advantage_estimator = advantage_estimator  # training_ops calls it as A.advantage_estimator
    trained: list[dict] = []
    pack_batch = TrainingOps.batch

    def batch(self, rollout):
        out = pack_batch(self, rollout)
        rows = out.rows
        for b, completion in enumerate(rollout.completions):
            start, length = int(rows.prompt_lens[b]), int(rows.response_lens[b])
            ids = rows.input_ids[b, start : start + length].tolist()
            mask = [int(m) for m in rows.mask[b, :length].tolist()]
            trained.append(
                {
                    "messages": completion.messages,
                    "tool_calls": completion.tool_calls,
                    "trained": [tokenizer.decode(t, skip_special_tokens=False) for m, t in runs(ids, mask) if m],
                    "not_trained": [tokenizer.decode(t, skip_special_tokens=False) for m, t in runs(ids, mask) if not m],
                    "own_mask_is_the_rows": list(completion.token_ids.mask) == mask,
                }
            )
        return out

    TrainingOps.batch = batch

    def before() -> None:
        called.clear()
        trained.clear()

    take_steps(args, run, specs, observed=lambda: {"estimators": list(called), "trajectories": list(trained)}, before=before)


if __name__ == "__main__":
    main()
