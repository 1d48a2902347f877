"""The model families page: the engine's registry of families (kuberl.engine.models.families), one section each."""

from __future__ import annotations

from pathlib import Path

from .markdown import cell, code, header, table


def _yes(on: bool) -> str:
    return "yes" if on else "no"


def _features(family) -> list[str]:
    found = []
    if family.qkv_bias:
        found.append("biases on q, k and v")
    if family.qk_norm:
        found.append("q/k norms")
    if [k for k in family.rope_scalings if k != "default"]:
        found.append("rope scaling: " + ", ".join(k for k in family.rope_scalings if k != "default"))
    if family.is_moe:
        found.append("mixture of experts")
    return found or ["Llama's shape"]


def _parallelism(family) -> str:
    p = family.parallelism
    return ", ".join(f"{name} {_yes(on)}" for name, on in (("tp", p.tp), ("pp", p.pp), ("ep", p.ep)))


def _test_link(node_id: str) -> str:
    path, _, rest = node_id.partition("::")
    return f"`{path}` {code(rest)}"


def _section(family) -> str:
    p = family.parallelism
    facts = [
        f"Hugging Face `model_type`: {', '.join(code(t) for t in family.model_types)}",
        f"Biases on q, k and v: {_yes(family.qkv_bias)}; q/k norms: {_yes(family.qk_norm)}",
        f"Rope scaling accepted (`rope_scaling`, or `rope_parameters`): {', '.join(code(k) for k in family.rope_scalings)}",
        f"Parallelism: tensor {_yes(p.tp)}, pipeline {_yes(p.pp)}, expert {_yes(p.ep)}" + (f" ({cell(p.notes)})" if p.notes else ""),
        "Jobs: " + ("run it" if family.job_refusal is None else f"refuse it for now: {cell(family.job_refusal)}"),
    ]
    if family.is_moe:
        facts.append(f"Routing: {cell(family.routing)}")
    if family.weights:
        facts.append(f"Weights: {cell(family.weights)}")
    facts += [cell(note) for note in family.notes]
    text = f"## {family.name}\n\n{cell(family.summary)}.\n\n" + "".join(f"- {f}\n" for f in facts) + "\n"
    if family.refusals:
        rows = [[code(r.field), cell(r.when), cell(r.why)] for r in family.refusals]
        text += "Refused, before any pod starts:\n\n" + table(["Config field", "When", "Why"], rows) + "\n"
    text += "Tested by (megatron-core against transformers on a tiny random model of the family, no download):\n\n"
    text += "".join(f"- {_test_link(t)}\n" for t in family.tests) + "\n"
    return text


def page(repo: Path) -> str:
    from kuberl.engine.models.arch import MAKE_VOCAB_SIZE_DIVISIBLE_BY
    from kuberl.engine.models.families import FAMILIES

    rows = [
        [
            f"[{f.name}](#{f.name})",
            ", ".join(code(t) for t in f.model_types),
            cell(", ".join(_features(f))),
            _parallelism(f),
            "yes" if f.job_refusal is None else "not yet",
        ]
        for f in FAMILIES.values()
    ]
    return (
        header("the engine's registry of model families (engine/models/families/, one file each)") + "# Model families\n\n"
        "The engine trains the decoder-only models below, each read from its Hugging Face `config.json` by its family's "
        "file in `engine/models/families/`. Every family here has grouped-query attention, RMSNorm, a SwiGLU MLP and "
        "rope; the embeddings are tied as the config's `tie_word_embeddings` says. A config is mapped onto "
        "megatron-core's transformer config (biases, q/k norms, rope scaling, experts and their routing), and "
        "whatever megatron-core, vLLM and transformers would not compute alike is refused, naming the field.\n\n"
        "The initializer checks the model's `config.json` when it fetches it, and `kuberl validate --local` and "
        "`kuberl run` check a local `model.path` folder they can read (`kuberl run` from the folder it runs in, as its "
        "ranks read it), so an unsupported family, feature or layout is refused before the trainer pods or ranks "
        "start. The layout check: tp must divide the key/value heads and the MLP's hidden size; pp the layers; ep "
        "the experts.\n\n"
        "A vocabulary that tp does not divide is padded the way Megatron-LM pads it, to a multiple of "
        f"{MAKE_VOCAB_SIZE_DIVISIBLE_BY} × tp, with zero rows in the embedding and the output layer; the padding ids' "
        "logits are masked, so log-probs, entropies and the loss are the model's own, and an export or the switch "
        "into vLLM drops the padding (the exported weights are the loaded ones, bit for bit). A vocabulary that tp "
        "divides is held as it is.\n\n" + table(["Family", "`model_type`", "Features", "Parallelism", "Jobs"], rows) + "\n"
        "A `model_type` not in this table is refused with the list of those that are.\n\n"
        "Adding a family is one file in `engine/models/families/` that calls `register_family`, and its equality "
        "test; `tests/test_model_families.py` checks that every family's file is registered, reads its example "
        "config as it declares, refuses what it lists, splits as it says, and names tests that exist.\n\n"
        + "".join(_section(f) for f in FAMILIES.values())
    )
