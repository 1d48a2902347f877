"""Rule rewards, user reward files, prompt files and the seeded loader."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kuberl.engine.config.data import DataSpec, DatasetSource, GeneratorSpec
from kuberl.engine.config.reward import RewardSpec
from kuberl.engine.data import DataError, PromptLoader, arithmetic, load_examples
from kuberl.engine.rewards import Rewarder, RewardError, last_number, math_answer


def spec(**kwargs) -> DataSpec:
    return DataSpec.model_validate({"train": {"generator": {"name": "arithmetic"}}, **kwargs})


@pytest.mark.parametrize(
    ("text", "number"),
    [("12 + 7 = 19", 19.0), ("The answer is 1,234.", 1234.0), ("-3", -3.0), ("no digits", None), ("2.50 then 7.25", 7.25)],
)
def test_last_number(text: str, number: float | None) -> None:
    assert last_number(text) == number


def test_math_answer_reads_the_last_number() -> None:
    assert math_answer("What is 12 + 7?", "12 + 7 = 19", "19") == 1.0
    assert math_answer("What is 12 + 7?", "19 is not 12 + 8", "19") == 0.0
    assert math_answer("q", "nothing", "19") == 0.0


def test_weighted_rules_and_arguments() -> None:
    rewarder = Rewarder(
        RewardSpec.model_validate(
            {
                "rules": [
                    {"name": "math_answer", "weight": 2.0},
                    {"name": "format", "weight": 0.5},
                    {"name": "length_penalty", "weight": 1.0, "args": {"max_chars": 4}},
                ]
            }
        )
    )
    scores, means = rewarder.score(["p", "p"], ["19", "it is 19"], ["19", "19"])
    # "19": 2*1 + 0.5*1 + 0; "it is 19": 2*1 + 0.5*0 - (8-4)/4
    assert scores == [2.5, 1.0]
    assert means == {"math_answer": 1.0, "format": 0.5, "length_penalty": -0.5}


def test_unknown_rule_argument_names_the_field() -> None:
    with pytest.raises(RewardError, match=r"reward.rules\[0\].args: 'max_len' is not an argument"):
        Rewarder(RewardSpec.model_validate({"rules": [{"name": "length_penalty", "args": {"max_len": 3}}]}))


def test_python_reward_file(tmp_path: Path) -> None:
    (tmp_path / "r.py").write_text("def reward(prompt, response, answer):\n    return float(len(response))\n")
    rewarder = Rewarder(RewardSpec.model_validate({"python": {"path": "r.py"}}), base_dir=tmp_path)
    assert rewarder.score(["p"], ["abc"], [None])[0] == [3.0]
    with pytest.raises(RewardError, match="reward.python.function: .* has no function 'score'"):
        Rewarder(RewardSpec.model_validate({"python": {"path": "r.py", "function": "score"}}), base_dir=tmp_path)
    (tmp_path / "bad.py").write_text("def reward(prompt, response, answer):\n    return float('nan')\n")
    with pytest.raises(RewardError, match="returned nan on response 0"):
        Rewarder(RewardSpec.model_validate({"python": {"path": "bad.py"}}), base_dir=tmp_path).score(["p"], ["r"], [None])


def test_arithmetic_generator_is_seeded() -> None:
    a = arithmetic(GeneratorSpec(name="arithmetic", count=5, seed=3, max_operand=9))
    assert a == arithmetic(GeneratorSpec(name="arithmetic", count=5, seed=3, max_operand=9))
    assert a != arithmetic(GeneratorSpec(name="arithmetic", count=5, seed=4, max_operand=9))
    for example in a:
        x, y = (int(t) for t in example.prompt.removeprefix("What is ").removesuffix("?").split(" + "))
        assert example.answer == str(x + y) and 0 <= x <= 9 and 0 <= y <= 9


def test_arithmetic_generator_with_three_operands() -> None:
    for example in arithmetic(GeneratorSpec(name="arithmetic", count=20, seed=1, max_operand=50, operands=3)):
        numbers = [int(t) for t in example.prompt.removeprefix("What is ").removesuffix("?").split(" + ")]
        assert len(numbers) == 3 and example.answer == str(sum(numbers))
    # Two operands draw what they always drew: the main job's prompts do not change.
    rng = random.Random(1)
    drawn = [(rng.randint(0, 50), rng.randint(0, 50)) for _ in range(3)]
    assert [e.prompt for e in arithmetic(GeneratorSpec(name="arithmetic", count=3, seed=1, max_operand=50))] == [
        f"What is {a} + {b}?" for a, b in drawn
    ]


def test_jsonl_bad_lines_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "ok", "answer": 1}\n\n{"prompt": "ok"\n')
    with pytest.raises(DataError, match=rf"^{path}:3: not valid JSON"):
        load_examples(DatasetSource(path=str(path)), spec())
    path.write_text('{"prompt": "ok"}\n{"question": "x"}\n')
    with pytest.raises(DataError, match=rf"^{path}:2: no field 'prompt' \(data.promptField\); fields: question"):
        load_examples(DatasetSource(path=str(path)), spec())
    path.write_text('{"q": "hi", "a": 3}\n')
    [example] = load_examples(DatasetSource(path=str(path)), spec(promptField="q", answerField="a"))
    assert (example.prompt, example.answer, example.where) == ("hi", "3", f"{path}:1")


def test_parquet_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": ["a", ""], "answer": ["1", "2"]}), path)
    with pytest.raises(DataError, match=rf"^{path}:row 1: 'prompt' must be a non-empty string"):
        load_examples(DatasetSource(path=str(path)), spec())


def test_dpo_records_need_both_responses(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "p", "chosen": "good"}) + "\n")
    with pytest.raises(DataError, match=r":1: dpo needs a non-empty string field 'rejected'"):
        load_examples(DatasetSource(path=str(path)), spec(), preferences=True)


def test_loader_resumes_where_it_stopped() -> None:
    examples = arithmetic(GeneratorSpec(name="arithmetic", count=10, seed=0))
    straight = PromptLoader(examples, 3, seed=5)
    seen = [straight.next_batch() for _ in range(7)]  # crosses two epochs (3 batches each)
    resumed = PromptLoader(examples, 3, seed=5)
    for _ in range(4):
        resumed.next_batch()
    state = resumed.state_dict()
    again = PromptLoader(examples, 3, seed=5)
    again.load_state_dict(state)
    assert [again.next_batch() for _ in range(3)] == seen[4:]
    assert seen[0] != seen[3]  # reshuffled per epoch
    with pytest.raises(DataError, match="promptsPerStep = 11 is more than the 10"):
        PromptLoader(examples, 11, seed=0)


def test_the_operator_reads_the_progress_the_engine_writes(tmp_path: Path) -> None:
    import datetime as dt

    from kuberl.engine.runtime import checkpoint as ckpt
    from kuberl.engine.runtime.progress import progress_report
    from kuberl.operator.api import RLJobStatus
    from kuberl.operator.control.reconcile.reading import apply_progress

    # A checkpoint committed as the engine commits it, reported as the controller rank reports it.
    ckpt.prepare(tmp_path, 5)
    ckpt.write_part(tmp_path, 5, 0, {"step": 5})
    ckpt.commit(tmp_path, 5, world_size=1, keep=2)
    text = progress_report(
        {"step": 7, "reward_mean": 0.5, "kl": float("nan"), "rollout_tokens_per_second": 120.0},
        total_steps=30,
        last_checkpoint=ckpt.status(tmp_path, 5),
    ).to_json()
    status = RLJobStatus()
    apply_progress(status, text)  # what the operator does with the ConfigMap's text
    assert (status.step, status.total_steps, status.metrics.reward_mean, status.metrics.kl, status.metrics.tokens_per_second) == (
        7,
        30,
        0.5,
        None,
        120.0,
    )
    assert status.last_checkpoint.step == 5 and status.last_checkpoint.path == str(tmp_path / "step-00000005")
    assert abs(status.last_checkpoint.time - dt.datetime.now(dt.timezone.utc)) < dt.timedelta(minutes=1)
    # ... and what the status then shows through the API: camelCase, as the CRD declares it.
    assert status.to_manifest()["lastCheckpoint"]["path"].endswith("step-00000005")


def test_reward_model_scores_prompt_and_response(tmp_path: Path) -> None:
    import torch
    import transformers

    from kuberl.engine.models.tiny import char_tokenizer

    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = transformers.LlamaForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    rewarder = Rewarder(RewardSpec.model_validate({"model": {"path": str(tmp_path / "rm")}}))
    prompts, responses = ["What is 1 + 1?", "What is 20 + 3?"], ["2", "it is 23, I think"]
    scores, means = rewarder.score(prompts, responses, [None, None])
    for prompt, response, score in zip(prompts, responses, scores):
        ids = tokenizer(prompt + response, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            expected = model(**ids).logits[0, 0].item()
        assert abs(score - expected) < 1e-5  # batched with padding = one at a time
    assert means["model"] == sum(scores) / 2 and scores[0] != scores[1]
    config.num_labels = 3
    transformers.LlamaForSequenceClassification(config).save_pretrained(tmp_path / "classifier")
    tokenizer.save_pretrained(tmp_path / "classifier")
    with pytest.raises(RewardError, match="has 3 output labels; a reward model has 1"):
        Rewarder(RewardSpec.model_validate({"model": {"path": str(tmp_path / "classifier")}}))
