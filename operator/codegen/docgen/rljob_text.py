"""The RLJob reference page's prose: the spec at a glance, validating a manifest, and the rules that hold only
on a cluster (operator/validation/cluster_rules.py). Kept apart from the generator (docgen_rljob), which walks the models;
tests/test_docs.py validates the glance as a whole RLJob."""

from __future__ import annotations

GLANCE = """```yaml
apiVersion: kuberl.dev/v1alpha1
kind: RLJob
metadata: {name: my-job}                 # a DNS label of at most 42 characters
spec:
  model: {hubId: Qwen/Qwen2.5-1.5B-Instruct}   # or path: a Hugging Face folder, or gguf: a .gguf file
  cache: {claimName: hub-cache}          # where hub downloads go (with a hubId)
  volumes:
    - {name: data, persistentVolumeClaim: {claimName: prompts}}
  data:
    train: {path: /data/train.jsonl}     # .jsonl or .parquet, or generator: {name: arithmetic, count, seed}
    validation: {path: /data/test.parquet}
    promptField: prompt
    answerField: answer                  # dpo: chosenField and rejectedField
    maxPromptLength: 512
  algorithm:
    name: grpo                           # ppo, grpo, rloo, reinforce_pp, dpo, dapo, gspo, cispo, dr_grpo
    clipRatio: 0.2
    klCoef: 0.001                        # > 0 needs roles.ref
    grpo: {normalizeByStd: true}         # a block per algorithm: ppo, grpo, reinforcePp, dapo, dpo
  rollout: {samplesPerPrompt: 8, maxNewTokens: 256, temperature: 1.0, topP: 1.0}
  reward:
    rules: [{name: math_answer}]         # and/or python: {path: ...}, model: {path: ...} with roles.reward
  roles:
    actor:
      replicas: 2
      gpusPerReplica: 8                  # one rank per GPU
      layout: {tp: 4, pp: 1, dp: 4, rolloutTp: 2}
      nodeSelector: {kuberl.dev/pool: gpu-h100}
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      volumeMounts: [{name: data, mountPath: /data, readOnly: true}]
    ref: {colocateWith: actor}           # the reference policy, on the actor's ranks
  trainer:
    totalSteps: 100                      # or totalEpochs
    promptsPerStep: 256
    miniBatchSize: 512                   # sequences per optimizer update
    microBatchSize: 4                    # sequences per rank per forward and backward (or microBatchTokens)
    optimizer: {name: adamw, lr: 1.0e-6}
    checkpoint: {path: /checkpoints, claimName: my-checkpoints, interval: 50, keep: 3}
    validationInterval: 20
  runPolicy: {backoffLimit: 3, activeDeadlineSeconds: 86400}
  monitoring: {metricsPort: 9400}
```
"""

VALIDATING_TEMPLATE = """## Validating a manifest

```sh
kuberl validate job.yaml more/*.yaml     # exit 0 when every file is valid, 1 otherwise
kuberl validate -R manifests/            # directories, and with -R their subdirectories
kuberl validate --local job.yaml         # for `kuberl run`: paths on this machine, no volumes needed
kuberl validate --allow-volume-source nfs job.yaml   # against a cluster whose chart allows more (also --allow-runtime-class, --allow-control-plane-tolerations, --allow-sandbox-egress, --allow-sandbox-dns)
```

`kuberl validate` checks every RLJob document of each file (documents of other kinds are skipped) against
the rules the API server enforces through the CRD, and, unless `--local`, against the
[rules that hold only on a cluster](#rules-that-hold-only-on-a-cluster). It names the file, the field and
the rule of each problem, and never answers with a traceback:

{example}

- **The API's names only**: `samplesPerPrompt`, never the Python name `samples_per_prompt`; an unknown field
  is an error, with the name it was probably meant to be.
- **Types and numbers JSON can carry**: types are strict (`replicas: "2"` is an error); `.inf`, `.nan` and
  integers beyond 64 bits are refused.
- **Kubernetes' rules for Kubernetes' fields**: `metadata` as the API server checks it; label keys and
  values, resource quantities (a request not above its limit), `affinity`, volumes and mounts as
  Kubernetes' own types; `image` as an image reference.
- **YAML as kubectl reads it**: merge keys, `kind: List` files (`kubectl get rlj -o yaml`), YAML 1.2 numbers
  such as `1e-6`; duplicate keys are errors; syntax errors give `file:line:column`.
- **Bounded work on hostile input**: files over 3 MiB, nesting deeper than 100 levels and aliases that expand
  past 100,000 values are refused before anything expands.
- **Mistakes that parse**: greedy sampling (`temperature: 0`) with several samples per prompt, the same
  reward rule twice, URLs as paths (the engine reads local paths: mount the data), `klInReward` without
  `klCoef`, a warm-up as long as the run, validation data equal to the training data.

The same checks run in the operator (a job that breaks one ends `Failed` with the reason `InvalidSpec`) and
in the engine before any model loads. Every rule of the sections below is listed with its fields.

"""


def cluster_rules() -> str:
    from ...validation import cluster_rules

    doc = " ".join((cluster_rules.__doc__ or "").split())
    return (
        "## Rules that hold only on a cluster\n\n" + doc + "\n\n"
        "`kuberl validate` checks them unless it is given `--local` (a manifest for `kuberl run`), and the operator "
        "refuses a job that breaks one with the condition `InvalidSpec`, before any pod exists:\n\n"
        "- the job has a trainer image: [spec.image](#spec.image), or the operator's default (the chart's `trainerImage`);\n"
        "- every path the engine opens is absolute and lies under a [volumeMount](#spec.roles.actor.volumeMounts) of each role "
        "whose pods open it (model, tokenizer and reward-model paths, [data](#spec.data), "
        "[reward.python](#spec.reward.python), [algorithm.plugins](#spec.algorithm.plugins)), or under "
        "[trainer.checkpoint.path](#spec.trainer.checkpoint.path); the paths it writes "
        "([trainer.exportPath](#spec.trainer.exportPath), a tracker's path) under a writable one;\n"
        "- a job that names a hub repository (`hubId`) has [spec.cache](#spec.cache);\n"
        "- without [trainer.checkpoint.claimName](#spec.trainer.checkpoint.claimName), the checkpoint path does not lie "
        "under a read-only volumeMount;\n"
        "- [volumes](#spec.volumes) use only persistentVolumeClaim, configMap, secret, emptyDir, ephemeral, projected, csi, "
        "image and downwardAPI, unless the chart's `admission.allowedVolumeSources` adds more (hostPath, gitRepo, nfs, ...);\n"
        "- a role's [runtimeClassName](#spec.roles.actor.runtimeClassName) is one of the chart's `admission.allowedRuntimeClasses` "
        "(none by default);\n"
        "- no [toleration](#spec.roles.actor.tolerations) of the control plane's taints (or of every taint, an empty key), "
        "unless the chart's `admission.allowControlPlaneTolerations`;\n"
        "- the tool sandbox pods' [egress](#spec.rollout.multiTurn.sandbox.egress) names only networks of the chart's "
        "`admission.allowedSandboxEgress`, exactly as listed there, and [dns](#spec.rollout.multiTurn.sandbox.dns) is true only "
        "where `admission.allowSandboxDNS` (neither by default);\n"
        "- no [annotation](#spec.roles.actor.annotations) that sets an AppArmor or seccomp profile to `unconfined`.\n\n"
        "The chart's admission policy refuses the same at the API server, and checks what only the cluster can: the user who "
        "sends the RLJob may get every Secret it names, and may create pods in the namespace when it names "
        "[serviceAccountName](#spec.serviceAccountName). `kuberl validate` lists those checks under each valid job "
        '("needs the cluster: ...").\n'
    )


# The example's output is what `kuberl validate` prints for these files when the page is generated.
EXAMPLE_FILES = ("tests/manifests/bad/ppo-without-critic.yaml", "tests/manifests/bad/unknown-field-typo.yaml")


def validating() -> str:
    """The "Validating a manifest" section, its example run through the real validator."""
    import contextlib
    import io

    from pathlib import Path

    from ...cli.commands import main

    out = io.StringIO()
    repo = Path(__file__).resolve().parents[3]  # the example's paths are relative to the checkout
    with contextlib.chdir(repo), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        main(["validate", *EXAMPLE_FILES])
    example = f"```text\n$ kuberl validate {' '.join(EXAMPLE_FILES)}\n{out.getvalue()}```"
    return VALIDATING_TEMPLATE.replace("{example}", example)
