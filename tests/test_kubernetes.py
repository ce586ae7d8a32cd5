"""`provisioner: kubernetes` without a cluster.

- Rendering: every object validates strictly against the Kubernetes 1.33 OpenAPI schema
  (kubernetes-validate), for MWMS, parameter_server, GPU, TPU, the single-process steps and a
  run with credentials; names, labels, backstops and accelerators are as the platforms
  expect; TPU layouts the backend cannot run fail with the field to change.
- Lifecycle: the real `kubernetes` client, configured through a kubeconfig file ($KUBECONFIG)
  or an Airflow connection, drives a fake API server (tests/fake_kubernetes.py) whose
  scripted kubelet plays the pods: logs stream live with `[role:i]` prefixes, a failing pod
  fails the step with its reason, an unschedulable pod times out with the scheduler's
  message, stop() and teardown delete with a propagation policy, release finds a crashed
  controller's objects by label, and the sweep spares active Jobs.
- Credentials reach the pods only through a Secret (envFrom): no value in any pod spec,
  rendered object, dry-run text, log line or manifest.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from fake_kubernetes import FakeKube, FakePod, ScriptedKubelet
from tasks.provision import launcher
from tasks.config import RunConfig
from tasks.errors import ConfigError, WorkerError
from tasks.provision.kubernetes import render
from tasks.provision.backends import to_text
from tasks.provision.kubernetes.backend import KubernetesBackend
from tasks.provision.spec import distributed_spec, single_process_spec
from tasks.runs.runlayout import RunContext

ROOT = Path(__file__).resolve().parent.parent
K8S_VERSION = "1.33"
BUCKET = "gs://bucket/bertflow"
SECRET = "s3cr3t-Key-9f8e7d"  # a credential value that must never leak
SECRETS = {"AIRFLOW_CONN_GCP": json.dumps({"conn_type": "google_cloud_platform",
                                           "extra": {"keyfile_dict": {"private_key": SECRET}}})}


def make_cfg(**overrides) -> RunConfig:
    values = dict(provisioner="kubernetes", artifact_root=BUCKET, num_workers=2,
                  strategy="multi_worker_mirrored")
    values.update(overrides)
    return RunConfig(**values)


def make_ctx(cfg: RunConfig, run_key: str = "manual__2024-05-01T10:00:00+00:00") -> RunContext:
    return RunContext(artifact_root=cfg.artifact_root, dag_id="bert_finetune", run_key=run_key)


def kinds(objects):
    return [o["kind"] for o in objects]


# --- rendering ------------------------------------------------------------------------------
CASES = {
    "mwms": dict(),
    "parameter_server": dict(strategy="parameter_server", num_workers=2, num_ps=1),
    "gpu": dict(accelerator="gpu", accelerator_type="nvidia-l4", devices_per_worker=2,
                worker_cpu="7", worker_memory="24Gi", node_selector={"pool": "gpu"},
                tolerations=["dedicated=ml:NoSchedule", "spot:NoExecute"],
                service_account="bertflow-trainer", image_pull_secrets=["regcred"]),
    "tpu": dict(accelerator="tpu", accelerator_type="tpu-v5-lite-podslice", tpu_topology="2x2",
                devices_per_worker=4, tpu_address="local", num_workers=1, strategy="tpu"),
    "secrets": dict(gcp_conn_id="gcp"),
}


def rendered(case: str, step: str = "train"):
    cfg = make_cfg(**CASES[case])
    ctx = make_ctx(cfg)
    spec = (distributed_spec(cfg, step, ctx.run_uri) if step in ("train", "evaluate")
            else single_process_spec(step, ctx.run_uri))
    return cfg, ctx, spec, KubernetesBackend().render(cfg, ctx, spec)


@pytest.mark.parametrize("case,step", [(c, "train") for c in CASES] +
                         [("mwms", "tokenize"), ("gpu", "export")])
def test_rendered_objects_validate_strictly_against_the_openapi_schema(case, step):
    cfg, ctx, spec, objects = rendered(case, step)
    # Controller form too: Secret values and ownerReferences to the created Service.
    created = render.render_objects(cfg, ctx, spec, secret_values=SECRETS, owner_uid="1234-uid")
    for obj in objects + created:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    # Strict mode rejects what the API server would drop: the check is not vacuous.
    bogus = json.loads(json.dumps(objects[-1]))
    bogus["spec"]["template"]["spec"]["containers"][0]["enviroment"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bogus, K8S_VERSION, strict=True)


def test_distributed_step_is_a_headless_service_and_one_indexed_job_per_role():
    cfg, ctx, spec, objects = rendered("parameter_server")
    assert kinds(objects) == ["Service", "Job", "Job", "Job"]
    service, *jobs = objects
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    name = service["metadata"]["name"]
    assert name == f"bf-{render.run_hash(ctx)}-train" and len(render.run_hash(ctx)) == 8
    cluster = None
    for job, (role, count) in zip(jobs, [("chief", 1), ("worker", 2), ("ps", 1)]):
        assert job["metadata"]["name"] == f"{name}-{role}"
        s = job["spec"]
        assert (s["completionMode"], s["completions"], s["parallelism"]) == ("Indexed", count,
                                                                              count)
        assert s["backoffLimit"] == 0 and s["ttlSecondsAfterFinished"] > 0
        assert s["activeDeadlineSeconds"] == cfg.worker_timeout_minutes * 60
        pod = s["template"]["spec"]
        assert pod["restartPolicy"] == "Never" and pod["subdomain"] == name
        assert len(f"{job['metadata']['name']}-{count - 1}") <= 63  # the pod hostname
        container = pod["containers"][0]
        assert container["command"] == spec.command
        env = {e["name"]: e["value"] for e in container["env"]}
        assert "TF_CONFIG" not in env and env[launcher.ROLE_ENV] == role
        assert env["TF_USE_LEGACY_KERAS"] == "1"
        cluster = cluster or env[launcher.CLUSTER_ENV]
        assert env[launcher.CLUSTER_ENV] == cluster  # the same cluster for every pod
        labels = job["metadata"]["labels"]
        assert labels == s["template"]["metadata"]["labels"]
        assert labels[render.MANAGED_BY] == "bertflow" and labels[render.ROLE] == role
        assert labels[render.STEP] == "train" and labels[render.DAG_ID] == "bert_finetune"
        assert labels[render.RUN_KEY] == "manual__2024-05-01T10_00_00_00_00"
        assert "ownerReferences" not in job["metadata"]  # dry run: no uid yet
    addresses = json.loads(cluster)
    assert addresses == {role: [f"{name}-{role}-{i}.{name}:{port}"
                                for i, port in enumerate(ports)]
                         for role, ports in (("chief", [2222]), ("worker", [2223, 2224]),
                                             ("ps", [2225]))}
    # Every pod gets a TF_CONFIG from its role, index and this cluster (tasks/provision/launcher.py).
    environ = {launcher.ROLE_ENV: "worker", launcher.CLUSTER_ENV: cluster,
               launcher.INDEX_ENV: "1"}
    assert json.loads(launcher.apply(environ))["task"] == {"type": "worker", "index": 1}


def test_single_process_steps_run_one_cpu_pod_without_cluster_env():
    for step in ("tokenize", "export"):
        cfg, ctx, spec, objects = rendered("gpu", step)
        assert kinds(objects) == ["Service", "Job"]
        job = objects[1]
        assert job["spec"]["completions"] == 1
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert container["image"].startswith("bertflow-trainer-cpu:")
        assert "nvidia.com/gpu" not in json.dumps(job)
        names = {e["name"] for e in container["env"]}
        assert not names & {launcher.ROLE_ENV, launcher.CLUSTER_ENV, "TF_CONFIG"}


def test_gpu_pods_request_gpus_on_matching_nodes():
    cfg, ctx, spec, objects = rendered("gpu")
    pod = objects[-1]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"].startswith("bertflow-trainer-gpu:")
    assert container["resources"] == {"requests": {"cpu": "7", "memory": "24Gi"},
                                      "limits": {"memory": "24Gi", "nvidia.com/gpu": "2"}}
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4",
                                   "pool": "gpu"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute"}]
    assert pod["serviceAccountName"] == "bertflow-trainer"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    # A registry and an explicit image.
    reg = make_cfg(**CASES["gpu"], image_registry="us-docker.pkg.dev/p/r/")
    job = KubernetesBackend().render(reg, make_ctx(reg), spec)[-1]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        "us-docker.pkg.dev/p/r/bertflow-trainer-gpu:")
    own = make_cfg(**CASES["gpu"], worker_image="example.com/mine:1")
    job = KubernetesBackend().render(own, make_ctx(own), spec)[-1]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "example.com/mine:1"


def test_parameter_server_gives_accelerators_to_workers_only():
    cfg = make_cfg(**CASES["parameter_server"], accelerator="gpu")
    ctx = make_ctx(cfg)
    jobs = KubernetesBackend().render(cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri))[1:]
    gpus = {j["metadata"]["labels"][render.ROLE]: "nvidia.com/gpu" in json.dumps(j)
            for j in jobs}
    assert gpus == {"chief": False, "worker": True, "ps": False}


def test_tpu_pods_ask_gke_for_a_single_host_slice():
    cfg, ctx, spec, objects = rendered("tpu")
    assert kinds(objects) == ["Service", "Job"]  # TPUStrategy: one process per host
    pod = objects[1]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"].startswith("bertflow-trainer-tpu:")
    assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator":
                                   "tpu-v5-lite-podslice",
                                   "cloud.google.com/gke-tpu-topology": "2x2"}
    assert {"key": "google.com/tpu", "operator": "Exists",
            "effect": "NoSchedule"} in pod["tolerations"]
    assert KubernetesBackend().check(cfg, ctx) == []


@pytest.mark.parametrize("change,field,words", [
    (dict(devices_per_worker=0), "devices_per_worker", "chips"),
    (dict(tpu_topology=""), "tpu_topology", "2x2"),
    (dict(accelerator_type=""), "accelerator_type", "gke-tpu-accelerator"),
    (dict(tpu_address="my-tpu"), "tpu_address", "'local'"),
    (dict(num_workers=2), "num_workers", "tpu_vm"),
    # GKE's topology tables: 4x4 on v5e is 16 chips on 4 hosts; 2x4 is one 8-chip host.
    (dict(tpu_topology="4x4"), "num_workers", "needs num_workers 4"),
    (dict(tpu_topology="2x4"), "devices_per_worker", "set devices_per_worker 8"),
    (dict(tpu_topology="2x2x1"), "tpu_topology", "2-dimensional"),
    (dict(accelerator_type="tpu-v5p-slice", tpu_topology="2x2x2"), "num_workers",
     "needs num_workers 2"),
    (dict(accelerator_type="tpu-v9-slice"), "accelerator_type", "tpu-v6e-slice"),
])
def test_tpu_layouts_the_backend_cannot_run_name_the_field(change, field, words):
    cfg = make_cfg(**{**CASES["tpu"], **change})
    for dry_run in (False, True):
        with pytest.raises(ConfigError) as err:
            KubernetesBackend().check(cfg, make_ctx(cfg), dry_run=dry_run)
        assert err.value.field == field and words in str(err.value)


@pytest.mark.parametrize("accelerator_type,topology,hosts,chips", [
    ("tpu-v5-lite-podslice", "1x1", 1, 1), ("tpu-v5-lite-podslice", "2x4", 1, 8),
    ("tpu-v5-lite-podslice", "4x4", 4, 4), ("tpu-v5-lite-podslice", "16x16", 64, 4),
    ("tpu-v6e-slice", "2x2", 1, 4), ("tpu-v6e-slice", "8x8", 16, 4),
    ("tpu-v4-podslice", "2x2x1", 1, 4), ("tpu-v4-podslice", "2x2x4", 4, 4),
    ("tpu-v5p-slice", "4x4x4", 16, 4),
])
def test_gke_tpu_topology_gives_hosts_and_chips_per_host(accelerator_type, topology, hosts,
                                                         chips):
    assert render.gke_tpu_hosts(accelerator_type, topology) == (hosts, chips)


def test_single_host_tpu_slices_that_match_their_topology_render():
    for topology, chips in (("1x1", 1), ("2x2", 4), ("2x4", 8)):
        cfg = make_cfg(**{**CASES["tpu"], "tpu_topology": topology,
                          "devices_per_worker": chips})
        assert KubernetesBackend().check(cfg, make_ctx(cfg)) == []
        pod = rendered_with(cfg)[-1]["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": str(chips)}


def rendered_with(cfg: RunConfig, step: str = "train") -> list[dict]:
    ctx = make_ctx(cfg)
    return KubernetesBackend().render(cfg, ctx, distributed_spec(cfg, step, ctx.run_uri))


def _pod(objects: list[dict], role: str = "worker") -> dict:
    job = next(o for o in objects if o["kind"] == "Job"
               and o["metadata"]["labels"][render.ROLE] == role)
    return job["spec"]["template"]["spec"]


def test_multi_gpu_pods_get_a_memory_backed_dev_shm():
    cfg, ctx, spec, objects = rendered("gpu")  # 2 GPUs per pod
    pod = _pod(objects)
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                            "sizeLimit": "1Gi"}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    # One GPU (no NCCL between local GPUs), CPU pods and TPU pods keep the default.
    one_gpu = make_cfg(**{**CASES["gpu"], "devices_per_worker": 1})
    for objs in (rendered_with(one_gpu), rendered("mwms")[3], rendered("tpu")[3]):
        for job in (o for o in objs if o["kind"] == "Job"):
            assert "volumes" not in job["spec"]["template"]["spec"]
    # The parameter_server chief and ps of a multi-GPU run are CPU pods: no /dev/shm either.
    ps = make_cfg(**{**CASES["gpu"], "strategy": "parameter_server", "num_ps": 1})
    objs = rendered_with(ps)
    assert "volumes" in _pod(objs, "worker")
    assert "volumes" not in _pod(objs, "chief") and "volumes" not in _pod(objs, "ps")


def test_owner_references_do_not_block_owner_deletion():
    """blockOwnerDeletion needs update on services/finalizers where the
    OwnerReferencesPermissionEnforcement admission plugin runs (OpenShift, ...); the
    controller deletes Background, which does not need it."""
    cfg, ctx, spec, _ = rendered("secrets")
    created = render.render_objects(cfg, ctx, spec, secret_values=SECRETS, owner_uid="u-1")
    refs = [o["metadata"]["ownerReferences"] for o in created[1:]]
    assert refs and all(r == [{"apiVersion": "v1", "kind": "Service",
                               "name": render.service_name(ctx, "train"), "uid": "u-1"}]
                        for r in refs)
    assert "blockOwnerDeletion" not in json.dumps(created)


def _backend_calls() -> dict[tuple[str, str], set[str]]:
    """{(API group, resource): verbs} of every client call in
    tasks/provision/kubernetes/{backend,pod_logs}.py, from the real client's method names
    (create_/list_/delete_/read_namespaced_<kind>)."""
    from kubernetes import client

    source = "".join((ROOT / "tasks" / "provision" / "kubernetes" / name).read_text()
                     for name in ("backend.py", "pod_logs.py"))
    found: dict[tuple[str, str], set[str]] = {}
    for api, method in set(re.findall(r"\b(core|batch)\.(\w+_namespaced_\w+)", source)):
        owner = client.CoreV1Api if api == "core" else client.BatchV1Api
        assert hasattr(owner, method), method  # a real client method, not a typo
        action, kind = method.split("_namespaced_")
        verb = {"read": "get"}.get(action, action)
        resource = {"pod_log": "pods/log"}.get(kind, f"{kind}s")
        found.setdefault(("" if api == "core" else "batch", resource), set()).add(verb)
    return found


def test_the_documented_rbac_role_is_exactly_what_the_backend_calls():
    """docs/deployment-iam.md's Role and RoleBinding: schema-valid, and their rules grant
    every verb the backend's code uses on each resource, and nothing else."""
    text = (ROOT / "docs" / "deployment-iam.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    objects = [o for block in blocks for o in yaml.safe_load_all(block) if o]
    assert kinds(objects) == ["Role", "RoleBinding"]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    role, binding = objects
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    calls = _backend_calls()
    assert {("", "pods/log"), ("batch", "jobs"), ("", "secrets")} <= set(calls)
    assert granted == calls
    # The table above the YAML lists the same verbs.
    for (group, resource), verbs in calls.items():
        row = re.search(rf"^\| `{re.escape(resource)}` \|[^|]*\| ([^|]*) \|", text, re.M)
        assert row and set(row.group(1).replace(",", " ").split()) == verbs, resource


def test_local_folders_fail_a_real_run_and_warn_a_dry_run(tmp_path):
    cfg = make_cfg(artifact_root=str(tmp_path))
    with pytest.raises(ConfigError) as err:
        KubernetesBackend().check(cfg, make_ctx(cfg))
    assert err.value.field == "artifact_root"
    warnings = KubernetesBackend().check(cfg, make_ctx(cfg), dry_run=True)
    assert len(warnings) == 1 and "artifact_root" in warnings[0]


def test_backend_module_imports_no_kubernetes_client():
    code = ("import sys, tasks.provision.kubernetes.backend, tasks.provision.kubernetes.render; "
            "assert 'kubernetes' not in sys.modules, 'imported eagerly'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# --- lifecycle against the fake API server --------------------------------------------------
@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """cluster(script) -> a running FakeKube; the client finds it through $KUBECONFIG."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    started = []

    def start(script, **options) -> FakeKube:
        kube = FakeKube(ScriptedKubelet(script), **options).__enter__()
        started.append(kube)
        monkeypatch.setenv("KUBECONFIG", str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
        return kube

    yield start
    for kube in started:
        kube.__exit__(None, None, None)


def fast_backend(**kwargs) -> KubernetesBackend:
    return KubernetesBackend(poll_seconds=0.05, grace_seconds=5,
                             **{"settle_seconds": 1.0, **kwargs})


class Lines(list):
    def of(self, task: str) -> list[str]:
        return [ln[len(task) + 3:] for ln in self if ln.startswith(f"[{task}] ")]


def serve_forever(pod: FakePod) -> None:
    pod.schedule()
    pod.run()
    pod.log(f"serving as {pod.role} {pod.index}")
    pod.wait_deleted(60)


def assert_step_gone(kube: FakeKube, ctx, step: str) -> None:
    selector = render.step_selector(ctx, step)
    for plural in ("jobs", "pods", "services", "secrets"):
        assert kube.names(plural, selector=selector) == [], plural
    job_deletes = [d for d in kube.deletes if d["plural"] == "jobs"]
    assert job_deletes and all(d["propagationPolicy"] == "Background" for d in job_deletes)
    assert all(d["query"].get("propagationPolicy") == "Background" and
               d["body"]["propagationPolicy"] == "Background" for d in job_deletes)


def test_two_workers_stream_their_logs_and_succeed(cluster):
    def script(pod: FakePod):
        pod.schedule()
        pod.run()
        env = pod.environment()
        pod.log(f"TF_CONFIG={launcher.apply(dict(env))}")
        for step in range(3):
            pod.log(f"step {step}")
            time.sleep(0.05)
        pod.succeed()

    kube = cluster(script)
    cfg = make_cfg()
    ctx = make_ctx(cfg)
    spec = distributed_spec(cfg, "train", ctx.run_uri)
    lines = Lines()
    started = time.monotonic()
    fast_backend().controller(cfg, ctx, spec, log=lines.append, secrets={}).run()
    assert time.monotonic() - started < 10

    service = render.service_name(ctx, "train")
    for index in (0, 1):
        out = lines.of(f"worker:{index}")
        assert out[1:] == ["step 0", "step 1", "step 2"], lines
        tf_config = json.loads(out[0].removeprefix("TF_CONFIG="))
        assert tf_config["task"] == {"type": "worker", "index": index}
        assert tf_config["cluster"] == {"worker": [f"{service}-worker-0.{service}:2222",
                                                   f"{service}-worker-1.{service}:2223"]}
    # Pods as Kubernetes made them: hostname <job>-<index> under the Service's subdomain.
    pods = [o for o in kube.created if o["kind"] == "Pod"]
    assert sorted(p["spec"]["hostname"] for p in pods) == [f"{service}-worker-0",
                                                           f"{service}-worker-1"]
    assert {p["spec"]["subdomain"] for p in pods} == {service}
    jobs = [o for o in kube.created if o["kind"] == "Job"]
    uid = next(o for o in kube.created if o["kind"] == "Service")["metadata"]["uid"]
    assert [j["metadata"]["ownerReferences"][0]["uid"] for j in jobs] == [uid]
    assert_step_gone(kube, ctx, "train")


def test_a_log_stream_the_api_server_ends_is_reopened_without_loss_or_repeats(cluster):
    """The API server ends every follow stream after 0.3 s. Each worker's 36 lines still
    arrive once each, in order: the reopened stream asks for timestamps since shortly before
    the last line seen, and skips what was delivered, lines sharing one timestamp included
    (one `log` call stamps its lines alike). The last line, written just before the pod ends,
    arrives too."""
    def script(pod: FakePod):
        pod.schedule()
        pod.run()
        for step in range(12):
            pod.log(f"step {step} a", f"step {step} b", f"step {step} c")  # one timestamp
            time.sleep(0.2)
        pod.succeed()

    kube = cluster(script, log_stream_seconds=0.3)
    cfg = make_cfg()
    ctx = make_ctx(cfg)
    lines = Lines()
    fast_backend().controller(cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri),
                              log=lines.append, secrets={}).run()
    expected = [f"step {step} {part}" for step in range(12) for part in "abc"]
    for index in (0, 1):
        task = f"worker:{index}"
        assert lines.of(task) == expected, lines
        said = [ln for ln in lines if ln.startswith(f"[cluster] log stream of {task} ")]
        assert len(said) == 1, lines  # said once, however often it happens
        again = [q for q in kube.log_requests
                 if q["pod"].startswith(f"{render.job_name(ctx, 'train', 'worker')}-{index}-")
                 and "sinceSeconds" in q]
        assert len(again) >= 2, kube.log_requests
        # since the last line seen, not the whole log: a margin of a minute, not the pod's age
        assert all(61 <= int(q["sinceSeconds"]) <= 70 for q in again), again
    assert all(q["timestamps"].lower() == "true" for q in kube.log_requests)
    assert_step_gone(kube, ctx, "train")


def test_parameter_server_step_ends_when_the_chief_succeeds(cluster):
    def script(pod: FakePod):
        if pod.role != "chief":
            return serve_forever(pod)
        pod.schedule()
        pod.run()
        pod.log("trained")
        pod.succeed()

    kube = cluster(script)
    cfg = make_cfg(**CASES["parameter_server"])
    ctx = make_ctx(cfg)
    lines = Lines()
    fast_backend().controller(cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri),
                              log=lines.append, secrets={}).run()
    assert lines.of("chief:0") == ["trained"]
    assert all(pod.deleted.is_set() for pod in kube.pods.values())
    assert_step_gone(kube, ctx, "train")


def _oom(pod):
    pod.fail(exit_code=137, reason="OOMKilled")


def _pull(pod):
    pod.image_pull_error("ImagePullBackOff", 'Back-off pulling image "bertflow-trainer-cpu"')


@pytest.mark.parametrize("outcome,words", [
    (_oom, ["OOMKilled (exit code 137)", "worker_memory"]),
    (lambda pod: pod.evict(), ["Evicted: The node was low on resource: memory."]),
    (lambda pod: pod.preempt(), ["preempted (PreemptionByScheduler"]),
    (_pull, ["ImagePullBackOff: Back-off pulling image", "image_pull_secrets"]),
])
def test_a_failing_pod_fails_the_step_with_its_reason_and_stops_the_others(
        cluster, outcome, words):
    def script(pod: FakePod):
        if pod.index != 1:
            return serve_forever(pod)
        if outcome is _pull:
            pod.schedule()
            time.sleep(0.2)
            return outcome(pod)
        pod.schedule()
        pod.run()
        pod.log("loading shard 3", "allocating 9 GiB")
        time.sleep(0.2)
        outcome(pod)

    kube = cluster(script)
    cfg = make_cfg(num_workers=3)
    ctx = make_ctx(cfg)
    started = time.monotonic()
    with pytest.raises(WorkerError) as err:
        fast_backend().controller(cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri),
                                  log=lambda line: None, secrets={}).run()
    assert time.monotonic() - started < 10
    message = str(err.value)
    pod_name = next(n for n in kube.created_names("pods") if "-worker-1-" in n)
    assert message.startswith(f"worker:1 (pod {pod_name}) failed: "), message
    for word in words:
        assert word in message
    if outcome is not _pull:
        assert "allocating 9 GiB" in message  # the last lines
    assert all(pod.deleted.is_set() for pod in kube.pods.values())
    assert_step_gone(kube, ctx, "train")


def test_a_killed_pod_is_named_though_a_peers_collective_failed_first(cluster):
    """worker:0's collective fails (exit 1) before worker:1, the root cause, is reported
    killed (exit 137, SIGKILL); worker:2 still runs. The error names worker:1 and its last
    lines, then worker:0."""
    def script(pod: FakePod):
        if pod.index == 2:
            return serve_forever(pod)
        pod.schedule()
        pod.run()
        if pod.index == 0:
            time.sleep(0.3)
            pod.log("CollectiveOps: peer worker:1 unreachable")
            return pod.fail(1)
        pod.log("step 4: loss 0.69")
        time.sleep(0.8)
        pod.fail(137)

    kube = cluster(script)
    cfg = make_cfg(num_workers=3)
    ctx = make_ctx(cfg)
    with pytest.raises(WorkerError) as err:
        fast_backend(settle_seconds=5).controller(
            cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri), log=lambda line: None,
            secrets={}).run()
    first = str(err.value).splitlines()[0]
    pod_name = next(n for n in kube.created_names("pods") if "-worker-1-" in n)
    assert first.startswith(f"worker:1 (pod {pod_name}) failed: Error (exit code 137); last "
                            f"line: step 4: loss 0.69; then worker:0 failed: Error (exit code "
                            f"1)"), first
    assert "CollectiveOps" not in str(err.value).split("---", 1)[1]


def test_an_unschedulable_pod_times_out_with_the_schedulers_reason(cluster):
    reason = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."

    def script(pod: FakePod):
        if pod.index == 1:
            pod.unschedulable(reason)
            return pod.wait_deleted(30)
        serve_forever(pod)

    kube = cluster(script)
    # Below the field's minimum (10 s), for a fast test.
    cfg = make_cfg().model_copy(update={"schedule_timeout_seconds": 1})
    ctx = make_ctx(cfg)
    lines = Lines()
    started = time.monotonic()
    with pytest.raises(WorkerError) as err:
        fast_backend().controller(cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri),
                                  log=lines.append, secrets={}).run()
    assert 1 <= time.monotonic() - started < 6
    assert "worker:1" in str(err.value) and "not scheduled within 1 s" in str(err.value)
    assert reason in str(err.value)
    assert any("waiting for a node: " + reason in ln for ln in lines)  # said early, too
    assert_step_gone(kube, ctx, "train")


def test_stop_from_another_thread_deletes_everything_with_propagation(cluster):
    kube = cluster(serve_forever)
    cfg = make_cfg(**CASES["parameter_server"], gcp_conn_id="gcp")
    ctx = make_ctx(cfg)
    lines = Lines()
    controller = fast_backend().controller(cfg, ctx, distributed_spec(cfg, "train",
                                                                      ctx.run_uri),
                                           log=lines.append, secrets=SECRETS)

    def stop_when_serving():
        deadline = time.monotonic() + 10
        while sum("serving as" in ln for ln in list(lines)) < 4 and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        controller.stop()

    stopper = threading.Thread(target=stop_when_serving)
    stopper.start()
    with pytest.raises(WorkerError, match="stopped"):
        controller.run()
    stopper.join()
    assert len(kube.pods) == 0 and len(kube.created_names("pods")) == 4
    assert_step_gone(kube, ctx, "train")
    assert {d["plural"] for d in kube.deletes} == {"jobs", "secrets", "services"}


def test_an_api_refusal_names_the_object_and_what_to_check(cluster):
    kube = cluster(serve_forever)
    cfg = make_cfg()
    ctx = make_ctx(cfg)
    # Someone else's Service holds the name (not labelled as bertflow's: never deleted).
    kube._create("services", "default", {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": render.service_name(ctx, "train")}, "spec": {"clusterIP": "None"}})
    with pytest.raises(WorkerError) as err:
        fast_backend().controller(cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri),
                                  log=lambda line: None, secrets={}).run()
    assert str(err.value).startswith(f"cannot create Service {render.service_name(ctx, 'train')}"
                                     f" in namespace default: 409 ")
    assert "already exists" in str(err.value)
    assert kube.names("services") == [render.service_name(ctx, "train")]


def test_release_finds_a_crashed_controllers_objects_by_label(cluster, tmp_path):
    kube = cluster(serve_forever)
    cfg = make_cfg(gcp_conn_id="gcp")
    ctx = make_ctx(cfg)
    other = make_ctx(cfg, run_key="another-run")
    render_other = render.render_objects(cfg, other, single_process_spec("export",
                                                                         other.run_uri))
    for obj in render_other:  # another run's objects: release must not touch them
        kube._create({"Service": "services", "Job": "jobs"}[obj["kind"]], "default", obj)
    # A controller process that dies (SIGKILL: no finally, no teardown) mid-step. Its output
    # goes to a file (a pipe nobody reads can fill and stall it); faulthandler writes its
    # threads' stacks there if it has not created the pods by then, so a failure says why.
    script, output = tmp_path / "controller.py", tmp_path / "controller.log"
    script.write_text(f"""
import faulthandler, sys
faulthandler.dump_traceback_later(60, exit=False)
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]
from test_kubernetes import make_cfg, make_ctx, fast_backend, SECRETS
from tasks.provision.spec import distributed_spec
cfg = make_cfg(gcp_conn_id="gcp")
ctx = make_ctx(cfg)
print("controller starts", flush=True)
fast_backend().controller(cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri),
                          log=lambda line: print(line, flush=True), secrets=SECRETS).run()
""")
    with open(output, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-u", str(script)], env=os.environ.copy(),
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        # A bound, not a speed check: the child imports the client stack, which on 2 busy
        # cores (the full suite runs pip and TensorFlow beside it) took over 30 s once.
        # This run's pods only: the kubelet also starts the other run's export pod.
        run = render.run_selector(ctx)
        started = kube.wait_for(lambda: len(kube.names("pods", selector=run)) == 2
                                and len(kube.names("secrets", selector=run)) == 1, timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert started, (f"the controller made no pods in 120 s (exit {proc.returncode}); "
                     f"jobs {kube.names('jobs')}, pods {list(kube.pods)}, secrets "
                     f"{kube.names('secrets')}; its output:\n{output.read_text()[-6000:]}")
    assert kube.names("jobs", selector=run) and kube.names("secrets", selector=run)

    released = fast_backend().release(cfg, ctx, log=lambda line: None)
    assert released["deleted"]["jobs"] == 1 and released["deleted"]["services"] == 1
    assert released["deleted"]["secrets"] == 1  # pods: gone with their Job, or deleted
    for plural in ("jobs", "pods", "services", "secrets"):
        assert kube.names(plural, selector=run) == []
    assert kube.names("jobs", selector=render.run_selector(other)) != []
    assert all(d["propagationPolicy"] == "Background" for d in kube.deletes)


def test_sweep_removes_what_finished_runs_left_and_spares_active_jobs(cluster):
    kube = cluster(serve_forever)
    cfg = make_cfg()

    def create(run_key: str, step: str = "train"):
        ctx = make_ctx(cfg, run_key)
        spec = single_process_spec(step, ctx.run_uri)
        for obj in render.render_objects(cfg, ctx, spec, secret_values=SECRETS):
            kube._create({"Service": "services", "Job": "jobs", "Secret": "secrets"}[
                obj["kind"]], "default", obj)
        return ctx

    finished, active, expired, orphaned, fresh = (create(k) for k in (
        "finished", "active", "expired", "orphaned", "fresh"))
    finished_job = render.job_name(finished, "train", "worker")
    kube.set_job_condition("default", finished_job, "Complete")
    # Past activeDeadlineSeconds (the Job controller is late marking it).
    kube.backdate("jobs", "default", render.job_name(expired, "train", "worker"),
                  cfg.worker_timeout_minutes + 1)
    # A controller died after its Job's TTL removed it: its Service and Secret remain.
    orphan_job = render.job_name(orphaned, "train", "worker")
    kube._delete("jobs", "default", orphan_job, "Orphan")
    for plural, name in (("services", render.service_name(orphaned, "train")),
                         ("secrets", render.secret_name(orphaned, "train"))):
        kube.backdate(plural, "default", name, 10)
    kube._delete("jobs", "default", render.job_name(fresh, "train", "worker"), "Orphan")
    # Orphaned pods: backdate them so the sweep treats them like the rest.
    for name in kube.names("pods", selector=render.run_selector(orphaned)):
        kube.backdate("pods", "default", name, 10)

    lines = Lines()
    removed = fast_backend().sweep(cfg, log=lines.append)
    for ctx in (finished, expired, orphaned):
        for plural in ("jobs", "services", "secrets", "pods"):
            assert kube.names(plural, selector=render.run_selector(ctx)) == [], (ctx, plural)
    assert f"job/{finished_job}" in removed and len(lines) == len(removed)
    active_sel = render.run_selector(active)
    assert kube.names("jobs", selector=active_sel) and kube.names("pods", selector=active_sel)
    assert kube.names("services", selector=render.run_selector(fresh))  # in its grace period


# --- credentials ----------------------------------------------------------------------------
def test_credentials_reach_pods_only_through_a_secret(cluster, tmp_path, monkeypatch):
    seen_env = {}

    def script(pod: FakePod):
        pod.schedule()
        pod.run()
        env = pod.environment()
        seen_env[pod.name] = env
        pod.log(f"have {sorted(k for k in env if k.startswith('AIRFLOW_CONN_'))}")
        pod.succeed()

    kube = cluster(script)
    cfg = make_cfg(gcp_conn_id="gcp")
    ctx = make_ctx(cfg)
    lines = Lines()
    fast_backend().controller(cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri),
                              log=lines.append, secrets=SECRETS).run()
    # Delivered: every pod's environment has the connection, through envFrom.
    assert len(seen_env) == 2
    assert all(env["AIRFLOW_CONN_GCP"] == SECRETS["AIRFLOW_CONN_GCP"]
               for env in seen_env.values())
    assert lines.of("worker:0") == ["have ['AIRFLOW_CONN_GCP']"]
    secret = next(o for o in kube.created if o["kind"] == "Secret")
    assert secret["metadata"]["labels"][render.RUN_HASH] == render.run_hash(ctx)
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "Service"
    assert kube.names("secrets") == []  # deleted with the step
    # Nowhere else: not in any other object the API server received, nor a log line.
    for obj in kube.created:
        if obj["kind"] != "Secret":
            assert SECRET not in json.dumps(obj), obj["kind"]
    for pod in (o for o in kube.created if o["kind"] == "Pod"):
        container = pod["spec"]["containers"][0]
        assert all(not e["name"].startswith("AIRFLOW_CONN") for e in container["env"])
        assert container["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    assert not any(SECRET in ln for ln in lines)

    # The dry run and the provision manifest (a local run folder: the seam skips the bucket
    # check, as the process-kubelet tests do).
    backend = KubernetesBackend()
    objects = [o for step in ("tokenize", "train") for o in backend.render(
        cfg, ctx, distributed_spec(cfg, step, ctx.run_uri) if step == "train"
        else single_process_spec(step, ctx.run_uri))]
    text = to_text(backend, objects)
    assert render.connections_secret_name(ctx) in text and SECRET not in text
    notes = backend.dry_run_notes(cfg, ctx)
    assert len(notes) == 1 and "AIRFLOW_CONN_GCP" in notes[0] and SECRET not in notes[0]
    from tasks.steps import provision
    from tasks.runs.runlayout import init_run

    local = cfg.model_copy(update={"artifact_root": str(tmp_path / "root")})
    local_ctx = make_ctx(local)
    init_run(local, local_ctx)
    monkeypatch.setenv("AIRFLOW_CONN_GCP", SECRETS["AIRFLOW_CONN_GCP"])  # as in a worker
    monkeypatch.setattr(provision, "backend_for",
                        lambda c: KubernetesBackend(_shares_host_disk=True))
    manifest = Path(provision.run(local, local_ctx)).read_text()
    assert "multi_worker_mirrored" in manifest and SECRET not in manifest


def test_dry_run_yaml_applies_and_its_pods_can_run(cluster, tmp_path):
    """The dry run's YAML, created object by object with the real client's create_from_dict
    (what `kubectl apply` sends) on the fake API server after the `kubectl create secret`
    command the dry run prints (run by a real shell, with a kubectl stand-in that hands its
    arguments to the real client): every pod's env references resolve, to the user's values."""
    import stat

    from kubernetes import config as k8s_config
    from kubernetes import utils as k8s_utils

    from tasks.steps import provision

    seen: dict[str, object] = {}

    def script(pod: FakePod):
        pod.schedule()
        try:
            seen[pod.name] = pod.environment()
        except KeyError as err:  # a Secret the pod names does not exist
            seen[pod.name] = err
        pod.run()
        pod.succeed()

    kube = cluster(script)
    cfg = make_cfg(gcp_conn_id="gcp", aws_conn_id="aws", hf_conn_id="hf", k8s_namespace="ml")
    ctx = make_ctx(cfg)
    notes: list[str] = []
    text = provision.dry_run(cfg, ctx, warn=notes.append)
    (note,) = notes
    command = note[note.index("kubectl create secret"):]
    assert text.startswith(f"# {note}\n") and SECRET not in text + note

    # The user's shell expands the connection variables; kubectl is a stand-in recording argv.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "kubectl"
    shim.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    values = {"AIRFLOW_CONN_GCP": SECRETS["AIRFLOW_CONN_GCP"],
              "AIRFLOW_CONN_AWS": "aws://AKIA:sec%20ret@",
              "AIRFLOW_CONN_HF": '{"conn_type": "generic", "password": "hf_token"}'}
    subprocess.run(["bash", "-c", command], check=True, timeout=30,
                   env={"PATH": f"{bin_dir}:/usr/bin:/bin", **values})
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:3] == ["create", "secret", "generic"]
    name, namespace = argv[3], argv[argv.index("--namespace") + 1]
    literals = dict(a.removeprefix("--from-literal=").split("=", 1) for a in argv
                    if a.startswith("--from-literal="))
    assert literals == values and namespace == "ml"
    client = k8s_config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
    k8s_utils.create_from_dict(client, {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace}, "stringData": literals})

    objects = [o for o in yaml.safe_load_all(text) if o]
    assert "Secret" not in kinds(objects)  # no placeholder Secret to overwrite the user's
    for obj in objects:
        k8s_utils.create_from_dict(client, obj)
    pods = sum(o["spec"]["completions"] for o in objects if o["kind"] == "Job")
    assert pods == 7  # data, tokenize, export: 1 each; train, evaluate: 2 workers each
    assert kube.wait_for(lambda: len(seen) == pods, timeout=30), seen
    for pod, env in seen.items():
        assert not isinstance(env, KeyError), f"{pod}: no Secret {env}"
        assert {k: env[k] for k in values} == values, pod


def test_airflow_connection_configures_the_client(cluster, tmp_path, monkeypatch):
    kube = cluster(lambda pod: (pod.schedule(), pod.run(), pod.log("tokenized"),
                                pod.succeed()))
    kubeconfig = Path(os.environ.pop("KUBECONFIG"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_K8S_TEST", json.dumps({
        "conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}))
    cfg = make_cfg(k8s_conn_id="k8s_test", k8s_namespace="ml")
    ctx = make_ctx(cfg)
    lines = Lines()
    fast_backend().controller(cfg, ctx, single_process_spec("tokenize", ctx.run_uri),
                              log=lines.append, secrets={}).run()
    assert lines.of("worker:0") == ["tokenized"]
    assert kube.created_names("jobs", "ml") == [render.job_name(ctx, "tokenize", "worker")]


# --- the CLI ---------------------------------------------------------------------------------
def test_cli_dry_run_prints_yaml_and_a_real_provision_refuses_a_local_folder(tmp_path):
    run_dir = tmp_path / "root" / "runs" / "bert_finetune" / "manual_1"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tasks", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    done = cli("init-run", "--run-dir", str(run_dir), "--provisioner", "kubernetes",
               "--num_workers", "2", "--accelerator", "gpu", "--gcp_conn_id", "gcp")
    assert done.returncode == 0, done.stderr
    done = cli("provision", "--dry-run", "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr
    objects = list(yaml.safe_load_all(done.stdout))
    assert kinds(objects).count("Service") == 5  # data, tokenize, train, evaluate, export
    jobs = [o for o in objects if o["kind"] == "Job"]
    assert len(jobs) == 5 and all(o["metadata"]["namespace"] == "default" for o in objects)
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert "warning: artifact_root" in done.stderr and "local path" in done.stderr
    assert not (run_dir / "provision").exists()  # a dry run writes nothing

    done = cli("provision", "--run-dir", str(run_dir))
    assert done.returncode == 2
    assert "artifact_root" in done.stderr and "gs://" in done.stderr


@pytest.mark.parametrize("platform, label", [
    ("eks", "node.kubernetes.io/instance-type"),
    ("karpenter", "karpenter.k8s.aws/instance-gpu-name")])
def test_gke_accelerator_label_is_refused_off_gke_naming_the_platforms_label(platform, label):
    cfg = RunConfig(provisioner="kubernetes", artifact_root="gs://b/r", accelerator="gpu",
                    accelerator_type="nvidia-l4", k8s_platform=platform)
    ctx = RunContext(artifact_root="gs://b/r", dag_id="d", run_key="k")
    with pytest.raises(ConfigError) as err:
        KubernetesBackend().check(cfg, ctx)
    assert err.value.field == "accelerator_type"
    assert "cloud.google.com/gke-accelerator" in str(err.value) and label in str(err.value)
    # Without GKE's label, a node selector of the platform's own picks the GPU nodes.
    ok = RunConfig(provisioner="kubernetes", artifact_root="gs://b/r", accelerator="gpu",
                   k8s_platform=platform, node_selector={label: "x"})
    assert KubernetesBackend().check(ok, ctx) == []
    [pod] = [o["spec"]["template"]["spec"] for o in KubernetesBackend().render(
        ok, ctx, single_process_spec("tokenize", ctx.run_uri)) if o["kind"] == "Job"]
    assert pod["nodeSelector"] == {label: "x"}
    [pod, *_] = [o["spec"]["template"]["spec"] for o in KubernetesBackend().render(
        ok, ctx, distributed_spec(ok, "train", ctx.run_uri))
        if o["kind"] == "Job"]
    assert pod["nodeSelector"] == {label: "x"}
