"""The planner: an RLJob in, its children out, as pure functions (no API server)."""

from __future__ import annotations

from pathlib import Path


from kuberl.operator.api import RLJob
from kuberl.operator.validation.manifest import load_rljobs, parse_rljob, read_documents
from kuberl.operator.control.children import LABEL_JOB, LABEL_ROLE, OperatorSettings
from kuberl.operator.control.planner import engine_config, plan

EXAMPLES = Path(__file__).parent.parent / "examples"
MANIFESTS = Path(__file__).parent / "manifests"
SETTINGS = OperatorSettings(default_image="registry.example.com/kuberl-trainer:0.1.0")


def example(name: str, namespace: str = "ns", **run_policy: object) -> RLJob:
    job = load_rljobs(EXAMPLES / name)[0]
    job.metadata.namespace = namespace
    for key, value in run_policy.items():
        setattr(job.spec.run_policy, key, value)
    return job


def test_ranks_are_laid_out_actor_first() -> None:
    config = engine_config(example("ppo-cluster/rljob.yaml"))
    roles = config.roles
    assert config.world_size == 24
    assert (roles["actor"].rank_offset, roles["actor"].ranks, roles["actor"].procs_per_pod) == (0, 16, 8)
    assert (roles["critic"].rank_offset, roles["critic"].ranks) == (16, 8)
    assert roles["ref"].colocated_with == "actor" and roles["ref"].ranks == 16 and roles["ref"].layout.dp == 16
    assert roles["actor"].rollout_tp == 2


def jobs_of(desired) -> dict:
    """Each replicated job of the plan's JobSet, by role."""
    return {r["name"]: r["template"] for r in desired.jobset["spec"]["replicatedJobs"]}


def test_plan_makes_one_indexed_job_per_role_with_pods() -> None:
    desired = plan(example("ppo-cluster/rljob.yaml"), uid="u-1", settings=SETTINGS)
    # ref is colocated: no pods of its own. The actor's 2 pods: the controller's, then the other in "actor-peers".
    assert set(jobs_of(desired)) == {"actor", "actor-peers", "critic"}
    actor = jobs_of(desired)["actor"]
    assert actor["metadata"]["labels"][LABEL_ROLE] == jobs_of(desired)["actor-peers"]["metadata"]["labels"][LABEL_ROLE] == "actor"
    assert desired.jobset["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    spec = actor["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"], spec["completionMode"]) == (1, 1, 0, "Indexed")
    peers = jobs_of(desired)["actor-peers"]["spec"]
    assert (peers["completions"], peers["parallelism"]) == (1, 1)
    peer_env = {e["name"]: e.get("value") for e in peers["template"]["spec"]["containers"][0]["env"]}
    assert peer_env["KUBERL_ROLE_RANK_OFFSET"] == "8"  # the actor's second pod: ranks 8-15
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"kuberl.dev/pool": "gpu-h100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # Time to finish the running step and checkpoint it after SIGTERM (runPolicy's default).
    assert pod["terminationGracePeriodSeconds"] == 300
    assert pod["shareProcessNamespace"] is True  # a SIGTERM before the rank's handlers ends it (not PID 1)
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"memory": "256Gi", "nvidia.com/gpu": "8"}
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    env = {e["name"]: e for e in container["env"]}
    # The model comes from the cache the initializer filled: trainers never reach the hub, nor hold its token.
    assert "HF_TOKEN" not in env and env["HF_HUB_OFFLINE"]["value"] == "1"
    assert {"name": "kuberl-cache", "mountPath": "/var/cache/kuberl", "readOnly": True} in container["volumeMounts"]
    assert env["KUBERL_ROLE_RANK_OFFSET"]["value"] == "0" and env["KUBERL_PROCS_PER_POD"]["value"] == "8"
    critic_env = {e["name"]: e.get("value") for e in jobs_of(desired)["critic"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert critic_env["KUBERL_ROLE_RANK_OFFSET"] == "16"


def test_tracking_credentials_reach_only_the_actor_pods_and_only_by_reference() -> None:
    [doc] = [d.content for d in read_documents((MANIFESTS / "good" / "tracking-all-backends.yaml").read_text(), "t")]
    doc["metadata"]["namespace"] = "ns"
    doc["spec"]["algorithm"]["klCoef"] = 0.01
    doc["spec"]["roles"]["ref"] = {"replicas": 1}  # a second role with pods of its own
    doc["spec"]["monitoring"]["tracking"][1].update(
        trackingUri="http://mlflow:5000", tokenSecretRef={"name": "mlflow-token", "key": "token"}
    )
    job = parse_rljob(doc, "t")
    desired = plan(job, uid="u", settings=SETTINGS)
    actor_env = {e["name"]: e for e in jobs_of(desired)["actor"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert actor_env["WANDB_API_KEY"] == {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}
    assert actor_env["MLFLOW_TRACKING_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "mlflow-token", "key": "token"}}
    ref_env = {e["name"] for e in jobs_of(desired)["ref"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not ref_env & {"WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN"}  # the controller rank is the actor's
    # The engine config (the pods' ConfigMap) names the trackers and the Secrets, nothing more.
    tracking = engine_config(job).to_manifest()["tracking"]
    assert [t["backend"] for t in tracking] == ["tensorboard", "mlflow", "wandb"]
    assert tracking[2]["apiKeySecretRef"] == {"name": "wandb", "key": "api-key"}


def test_trainer_may_only_write_its_progress_configmap() -> None:
    desired = plan(example("grpo-smollm2-arith.yaml"), uid="u", settings=SETTINGS)
    role = next(o for o in desired.support if o["kind"] == "Role")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["grpo-smollm2-arith-progress"],
            "verbs": ["get", "update", "patch"],
        }
    ]
    assert all(o["metadata"]["labels"][LABEL_JOB] == "grpo-smollm2-arith" for o in desired.support)


def test_no_secret_value_in_any_planned_object() -> None:
    desired = plan(example("ppo-cluster/rljob.yaml"), uid="u", settings=SETTINGS)
    text = str(desired)
    assert "hf-token" in text and "secretKeyRef" in text  # referenced ...
    assert "stringData" not in text and "kind': 'Secret'" not in text  # ... never copied


def test_one_jobset_holds_every_role_with_pods_and_restarts_the_gang() -> None:
    desired = plan(example("ppo-cluster/rljob.yaml"), uid="u", settings=SETTINGS, restarts_before=2, preemptions_before=1)
    js = desired.jobset
    assert js["kind"] == "JobSet" and js["metadata"]["name"] == "ppo-qwen-math"
    assert js["metadata"]["annotations"] == {"kuberl.dev/restarts-before": "2", "kuberl.dev/preemptions-before": "1"}
    spec = js["spec"]
    assert [r["name"] for r in spec["replicatedJobs"]] == ["actor", "actor-peers", "critic"]  # ref is colocated
    # A failed pod fails its Job (backoffLimit 0) and JobSet recreates every Job: the backoffLimit left; unless a
    # rank exited 3 (a restart cannot help): its Job's podFailurePolicy fails it, and that fails the JobSet.
    assert spec["failurePolicy"] == {
        "maxRestarts": 3,
        "restartStrategy": "Recreate",
        "rules": [{"name": "NotRetryable", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}],
    }
    for replicated in spec["replicatedJobs"]:
        job_spec = replicated["template"]["spec"]
        assert job_spec["backoffLimit"] == 0 and job_spec["podFailurePolicy"] == {
            "rules": [{"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [3]}}]
        }
        [trainer] = job_spec["template"]["spec"]["containers"]
        assert trainer["name"] == "trainer" and trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert job_spec["template"]["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["actor", "actor-peers"]}  # every actor pod
    assert spec["network"] == {"subdomain": "ppo-qwen-math", "enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert "suspend" not in spec  # no queue: the pods start as soon as they can be scheduled
    actor = spec["replicatedJobs"][0]["template"]["spec"]
    assert actor["template"]["spec"]["containers"][0]["env"][0]["name"] == "KUBERL_JOB"
    env = {e["name"]: e.get("value") for e in actor["template"]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "ppo-qwen-math-actor-0-0.ppo-qwen-math.ns.svc"  # JobSet's hostname of the actor's pod 0


def test_a_queued_job_is_one_suspended_jobset_with_its_queue_and_priority() -> None:
    job = example("grpo-smollm2-arith.yaml")
    job.spec.run_policy.scheduling.queue_name = "team-a"
    job.spec.run_policy.scheduling.workload_priority_class = "rl-high"
    js = plan(job, uid="u", settings=SETTINGS).jobset
    assert js["spec"]["suspend"] is True
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert js["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "rl-high"
    assert "managedBy" not in js["spec"]
    job.spec.run_policy.scheduling.multi_kueue = True
    assert plan(job, uid="u", settings=SETTINGS).jobset["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"


def separate_job(**rollout_role: object) -> RLJob:
    """tests/manifests/good/cluster-separate-placement.yaml: 2 actor pods on CPUs, 2 rollout pods (1 GPU each)."""
    [doc] = [d.content for d in read_documents((MANIFESTS / "good" / "cluster-separate-placement.yaml").read_text(), "s")]
    doc["metadata"].update(name="gen", namespace="ns")
    doc["spec"]["roles"]["rollout"].update(rollout_role)
    return parse_rljob(doc, "s")


def pod_of(desired, role: str) -> dict:
    return jobs_of(desired)[role]["spec"]["template"]["spec"]


def test_separate_placement_gives_the_rollout_role_pods_of_its_own_after_the_actors_ranks() -> None:
    job = separate_job()
    config = engine_config(job)
    assert config.world_size == 4  # 2 actor ranks, then 2 rollout ranks (one per GPU pod)
    assert (config.roles["rollout"].rank_offset, config.roles["rollout"].ranks, config.roles["rollout"].procs_per_pod) == (2, 2, 1)
    desired = plan(job, uid="u", settings=SETTINGS)
    js = desired.jobset["spec"]
    assert [r["name"] for r in js["replicatedJobs"]] == ["actor", "actor-peers", "rollout"]  # the actor: 2 pods of 1 rank
    assert js["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["actor", "actor-peers"]}  # the controller stops the fleet
    rollout = jobs_of(desired)["rollout"]
    assert rollout["metadata"]["labels"] == {LABEL_JOB: "gen", LABEL_ROLE: "rollout"}
    spec = rollout["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"], spec["completionMode"]) == (2, 2, 0, "Indexed")
    assert spec["template"]["metadata"]["labels"][LABEL_ROLE] == "rollout"
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["kuberl", "worker"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["KUBERL_ROLE"], env["KUBERL_ROLE_RANK_OFFSET"], env["KUBERL_PROCS_PER_POD"], env["WORLD_SIZE"]) == (
        "rollout",
        "2",
        "1",
        "4",
    )
    assert env["MASTER_ADDR"] == "gen-actor-0-0.gen.ns.svc"
    # gpusPerReplica is the pods' GPU limit; the rest of the pod is the actor's (requests, tolerations, volumes).
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"nvidia.com/gpu": "1"}}
    actor_pod = pod_of(desired, "actor")
    assert "limits" not in actor_pod["containers"][0]["resources"]  # the actor has no GPUs here
    assert pod["tolerations"] == actor_pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert container["volumeMounts"] == actor_pod["containers"][0]["volumeMounts"]
    assert {v["name"] for v in pod["volumes"]} >= {"models", "data"}
    # Only the controller rank (the actor's first pod) writes progress: the rollout pods get no token.
    assert pod["automountServiceAccountToken"] is False and actor_pod["automountServiceAccountToken"] is True
    # The engine config every rank reads names the role and its ranks.
    configmap = next(o for o in desired.support if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gen-config")
    assert '"rollout"' in configmap["data"]["engine-config.json"]


def test_the_rollout_role_places_its_pods_on_a_pool_of_its_own_and_keeps_the_rest_of_the_actors() -> None:
    inference = {"key": "pool", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}
    job = separate_job(
        nodeSelector={"pool": "inference"},
        tolerations=[inference],
        resources={"requests": {"cpu": "8", "memory": "32Gi"}},
    )
    desired = plan(job, uid="u", settings=SETTINGS)
    pod, actor_pod = pod_of(desired, "rollout"), pod_of(desired, "actor")
    assert pod["nodeSelector"] == {"pool": "inference"} and "nodeSelector" not in actor_pod
    assert pod["tolerations"] == [inference] and actor_pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"nvidia.com/gpu": "1"}}
    assert actor_pod["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}
    # What it does not set stays the actor's: the volumes the engine reads the model from.
    assert pod["containers"][0]["volumeMounts"] == actor_pod["containers"][0]["volumeMounts"]
    assert job.spec.roles.actor.node_selector is None  # the job's own spec is left as it was


def test_separate_placement_rollout_pods_are_trainer_peers_and_queued_with_the_gang() -> None:
    job = separate_job(replicas=3, gpusPerReplica=2, layout={"dp": 6})
    job.spec.run_policy.scheduling.queue_name = "team-a"
    desired = plan(job, uid="u", settings=SETTINGS)
    [policy] = [o for o in desired.support if o["kind"] == "NetworkPolicy"]
    [trainers] = policy["spec"]["ingress"][0]["from"]
    assert trainers["podSelector"]["matchExpressions"] == [{"key": LABEL_ROLE, "operator": "In", "values": ["actor", "rollout"]}]
    # One suspended JobSet for Kueue: a PodSet per replicated job, the rollout role's among them.
    js = desired.jobset
    assert js["spec"]["suspend"] is True and js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    rollout = jobs_of(desired)["rollout"]["spec"]
    assert (rollout["parallelism"], rollout["completions"]) == (3, 3)
    assert rollout["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    env = {e["name"]: e.get("value") for e in rollout["template"]["spec"]["containers"][0]["env"]}
    assert (env["KUBERL_ROLE_RANK_OFFSET"], env["KUBERL_PROCS_PER_POD"], env["WORLD_SIZE"]) == ("2", "2", "8")
