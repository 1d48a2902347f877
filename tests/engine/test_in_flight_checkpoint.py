"""What a checkpoint keeps of the batches on their way (separate placement), read back as a resumed run
reads it: plain values in, completions out, and anything else refused with what is wrong."""

from __future__ import annotations

import pytest

from kuberl.engine.rollout.vllm_backend import Completion
from kuberl.engine.steps.async_rollout import GenerationPipeline, InFlightRefused, SavedCompletion


def pipeline() -> GenerationPipeline:
    return GenerationPipeline(fleet=None, max_staleness=1, total_steps=5)  # type: ignore[arg-type]  # restore needs no fleet


def test_a_kept_completion_reads_back_as_it_was() -> None:
    c = Completion(prompt_index=3, token_ids=[5, 6, 7], logprobs=[-0.5, -1.25, -0.125], finished_by_stop=True, versions=(2, 2, 2))
    kept = {4: [SavedCompletion.of(c).model_dump()]}
    p = pipeline()
    p.restore(kept)
    assert p.kept == {4: [c]}


@pytest.mark.parametrize(
    "kept, says",
    [
        ([1, 2], "not a map of steps to completions"),
        ({"4": []}, "not a map of steps to completions"),
        ({4: [{"prompt_index": 0, "token_ids": [1], "logprobs": [0.0], "finished_by_stop": True}]}, "Field required"),
        ({4: [{"prompt_index": 0, "token_ids": ["1"], "logprobs": [0.0], "finished_by_stop": True, "versions": [1]}]}, "valid integer"),
        (
            {4: [{"prompt_index": 0, "token_ids": [1], "logprobs": [0.0], "finished_by_stop": True, "versions": [1], "code": "x"}]},
            "Extra inputs",
        ),
    ],
)
def test_anything_else_is_refused_saying_what(kept, says: str) -> None:
    with pytest.raises(InFlightRefused, match=says):
        pipeline().restore(kept)
