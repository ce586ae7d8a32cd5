"""Spot capacity and re-provisioning after preemption (tasks/provision/capacity.py, attempts.py).

- Rendering: capacity spot / reservation / flex_start in every backend's own objects,
  validated by kubernetes-validate (Kubernetes) and by the installed clients' proto types
  (Vertex AI CustomJob, Cloud TPU QueuedResource); combinations a backend cannot express fail
  with the field to change; the dry run shows them.
- The controller side of preemption, through each backend's real controller: a worker exiting
  75 (preempted, saved) or vanishing (lost) is provisioned again, a bounded number of times,
  with BERTFLOW_ATTEMPT set and `{step}/attempts.json` recording each attempt; a failure
  still fails; past max_preemptions a clear error names the field.

The workers here are a tiny stand-in (STAND_IN below): a real process that, on its first
attempt, waits for SIGTERM, then writes its preemption file and exits 75, as the contract with
the trainer says; later attempts succeed. Real training resume (weights, data order) is
tested with the trainer itself by tests of the worker side. The Kubernetes API and Vertex AI
are fakes on loopback (tests/fake_kubernetes.py with its ProcessKubelet, which runs pods as
local processes; tests/fake_vertex.py) driven by the real client libraries.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import kubernetes_validate
import pytest

from fake_kubernetes import FakeKube, ProcessKubelet
from fake_vertex import FakeVertex
from tasks.config import RunConfig, parse_config
from tasks.errors import PREEMPTED_EXIT_CODE, ConfigError, WorkerError
from tasks.provision import attempts, capacity
from tasks.steps.provision import dry_run
from tasks.provision.tpu_vm import backend as tpu_vm
from tasks.provision.tpu_vm import render as tpu_render
from tasks.provision.vertex_ai import backend as vertex_ai
from tasks.provision.vertex_ai import client as vertex_client
from tasks.provision.backends import backend_for
from tasks.provision.kubernetes.backend import KubernetesBackend
from tasks.provision.local.backend import LocalBackend
from tasks.provision.spec import BASE_ENV, WorkerSpec, distributed_spec, step_spec
from tasks.runs.runlayout import RunContext

K8S_VERSION = "1.33"
BUCKET = "gs://bucket/bertflow"


def ctx_for(root: str) -> RunContext:
    return RunContext(artifact_root=root, dag_id="bert_finetune", run_key="run1")


# --- config ---------------------------------------------------------------------------------
def test_capacity_and_reservation_go_together():
    with pytest.raises(ConfigError) as err:
        parse_config({"provisioner": "kubernetes", "capacity": "reservation"})
    assert err.value.field == "reservation"
    with pytest.raises(ConfigError) as err:
        parse_config({"provisioner": "kubernetes", "reservation": "r1"})
    assert err.value.field == "capacity"


@pytest.mark.parametrize("values, field", [
    (dict(provisioner="local", capacity="spot"), "capacity"),
    (dict(provisioner="kubernetes", capacity="flex_start"), "capacity"),
    (dict(provisioner="tpu_vm", capacity="flex_start"), "capacity"),
    (dict(provisioner="kubernetes", k8s_platform="eks", capacity="reservation",
          reservation="r1"), "capacity"),
    (dict(provisioner="kubernetes", capacity="reservation", reservation="projects/p/x"),
     "reservation"),
    (dict(provisioner="vertex_ai", capacity="reservation", reservation="r1"), "reservation"),
    (dict(provisioner="vertex_ai", capacity="flex_start"), "capacity"),
    (dict(provisioner="vertex_ai", capacity="flex_start", accelerator_type="NVIDIA_L4",
          worker_timeout_minutes=20000), "worker_timeout_minutes"),
    (dict(provisioner="vertex_ai", capacity="flex_start", accelerator_type="NVIDIA_L4",
          num_workers=2, num_ps=1), "capacity"),
    # Dynamic Workload Scheduler serves L4, A100, H100, H200 and B200 only.
    (dict(provisioner="vertex_ai", capacity="flex_start", accelerator="gpu",
          accelerator_type="NVIDIA_TESLA_T4"), "accelerator_type"),
    (dict(provisioner="vertex_ai", capacity="flex_start", accelerator="gpu",
          accelerator_type="NVIDIA_TESLA_V100"), "accelerator_type"),
])
def test_capacities_a_backend_cannot_express_name_the_field(values, field):
    with pytest.raises(ConfigError) as err:
        capacity.check(RunConfig(**values))
    assert err.value.field == field


@pytest.mark.parametrize("gpu", capacity.FLEX_START_GPUS)
def test_flex_start_takes_each_gpu_the_scheduler_serves(gpu):
    cfg = RunConfig(**{**VERTEX, "accelerator_type": gpu, "capacity": "flex_start"})
    capacity.check(cfg)


def test_flex_start_on_another_gpu_names_the_served_ones_and_the_page():
    with pytest.raises(ConfigError) as err:
        capacity.check(RunConfig(**{**VERTEX, "accelerator_type": "NVIDIA_TESLA_T4",
                                    "capacity": "flex_start"}))
    text = str(err.value)
    assert "does not serve NVIDIA_TESLA_T4" in text and "NVIDIA_L4" in text
    assert "NVIDIA_B200" in text and capacity.FLEX_START_DOCS in text


# --- Kubernetes -----------------------------------------------------------------------------
def k8s_pods(**overrides) -> list[dict]:
    cfg = RunConfig(provisioner="kubernetes", artifact_root=BUCKET, num_workers=2,
                    strategy="multi_worker_mirrored", **overrides)
    capacity.check(cfg)
    ctx = ctx_for(BUCKET)
    objects = KubernetesBackend().render(cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri))
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    return [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Job"]


@pytest.mark.parametrize("overrides, selector, toleration", [
    (dict(capacity="spot"), {"cloud.google.com/gke-spot": "true"},
     {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
      "effect": "NoSchedule"}),
    (dict(capacity="spot", k8s_platform="eks"), {"eks.amazonaws.com/capacityType": "SPOT"},
     None),
    (dict(capacity="spot", k8s_platform="karpenter"), {"karpenter.sh/capacity-type": "spot"},
     None),
    (dict(capacity="reservation", reservation="l4-block"),
     {"cloud.google.com/reservation-name": "l4-block",
      "cloud.google.com/reservation-affinity": "specific"}, None),
])
def test_kubernetes_pods_select_spot_or_reserved_nodes(overrides, selector, toleration):
    for pod in k8s_pods(**overrides, accelerator="gpu", accelerator_type="nvidia-l4"):
        assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4",
                                       **selector}
        if toleration:
            assert toleration in pod["tolerations"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists",
                "effect": "NoSchedule"} in pod["tolerations"]
        # EKS gives the save most of EC2's 2-minute warning; GKE's 15 s is not the pod's to ask
        expected = 110 if overrides["capacity"] == "spot" and overrides.get(
            "k8s_platform") in ("eks", "karpenter") else None
        assert pod.get("terminationGracePeriodSeconds") == expected


def test_on_demand_pods_carry_no_capacity_labels():
    for pod in k8s_pods():
        assert "nodeSelector" not in pod and "tolerations" not in pod


# --- Vertex AI ------------------------------------------------------------------------------
VERTEX = dict(provisioner="vertex_ai", gcp_project="proj", gcp_region="us-central1",
              image_registry="us-docker.pkg.dev/proj/repo", artifact_root="gs://b/r",
              accelerator="gpu", accelerator_type="NVIDIA_L4", num_workers=2)
RESERVATION = "projects/proj/zones/us-central1-a/reservations/l4-block"


def vertex_job(**overrides):
    """The CustomJob as the client's proto type (parsing rejects unknown fields and enums)."""
    from google.cloud.aiplatform_v1 import CustomJob

    cfg = RunConfig(**{**VERTEX, **overrides})
    capacity.check(cfg)
    ctx = ctx_for(cfg.artifact_root)
    [rendered] = backend_for(cfg).render(cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri))
    return CustomJob.from_json(json.dumps(rendered), ignore_unknown_fields=False)


def test_vertex_spot_and_flex_start_set_the_scheduling_strategy():
    from google.cloud.aiplatform_v1 import Scheduling

    assert vertex_job().job_spec.scheduling.strategy == Scheduling.Strategy.STRATEGY_UNSPECIFIED
    assert vertex_job(capacity="spot").job_spec.scheduling.strategy == Scheduling.Strategy.SPOT
    flex = vertex_job(capacity="flex_start", schedule_timeout_seconds=3600).job_spec.scheduling
    assert flex.strategy == Scheduling.Strategy.FLEX_START
    assert flex.max_wait_duration.total_seconds() == 3600
    assert flex.restart_job_on_worker_restart  # MWMS keeps restarting as a whole


def test_vertex_reservation_is_a_specific_reservation_affinity_on_every_pool():
    from google.cloud.aiplatform_v1 import ReservationAffinity

    job = vertex_job(capacity="reservation", reservation=RESERVATION)
    for pool in job.job_spec.worker_pool_specs:
        affinity = pool.machine_spec.reservation_affinity
        assert affinity.reservation_affinity_type == \
            ReservationAffinity.Type.SPECIFIC_RESERVATION
        assert affinity.key == "compute.googleapis.com/reservation-name"
        assert list(affinity.values) == [RESERVATION]
    assert not vertex_job().job_spec.worker_pool_specs[0].machine_spec.reservation_affinity.key


# --- Cloud TPU ------------------------------------------------------------------------------
def tpu_resource(**overrides):
    cfg = RunConfig(provisioner="tpu_vm", accelerator="tpu", accelerator_type="v5litepod-8",
                    tpu_zone="us-west4-a", tpu_address="local", artifact_root="gs://b/r",
                    image_registry="us-docker.pkg.dev/proj/repo", **overrides)
    capacity.check(cfg)
    return tpu_render.queued_resource(cfg, ctx_for(cfg.artifact_root), "proj")


def test_tpu_queued_resource_tier_spot_or_reservation():
    from google.cloud import tpu_v2

    plain = tpu_resource()
    assert "spot" not in plain and not plain.reservation_name
    spot = tpu_resource(capacity="spot")
    assert "spot" in spot and isinstance(spot.spot, tpu_v2.QueuedResource.Spot)
    assert tpu_resource(capacity="reservation", reservation="v5e-block").reservation_name == \
        "projects/proj/locations/us-west4-a/reservations/v5e-block"
    full = "projects/other/locations/us-west4-a/reservations/shared"
    assert tpu_resource(capacity="reservation", reservation=full).reservation_name == full
    # the REST JSON the dry run prints parses back into the client's type
    text = json.dumps(tpu_render.to_dict(spot))
    assert "spot" in tpu_v2.QueuedResource.from_json(text, ignore_unknown_fields=False)


def test_the_dry_run_shows_the_capacity_fields():
    k8s = RunConfig(provisioner="kubernetes", artifact_root=BUCKET, capacity="spot")
    assert "cloud.google.com/gke-spot: 'true'" in dry_run(k8s, ctx_for(BUCKET), warn=lambda m: 0)
    vertex = RunConfig(**{**VERTEX, "capacity": "flex_start"})
    assert '"strategy": "FLEX_START"' in dry_run(vertex, ctx_for("gs://b/r"), warn=lambda m: 0)


def _k8s_step_pods(step: str, **overrides) -> list[dict]:
    cfg = RunConfig(provisioner="kubernetes", artifact_root=BUCKET, accelerator="gpu",
                    accelerator_type="nvidia-l4", **overrides)
    capacity.check(cfg)
    ctx = ctx_for(BUCKET)
    objects = KubernetesBackend().render(cfg, ctx, step_spec(cfg, step, ctx.run_uri))
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    return [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Job"]


@pytest.mark.parametrize("overrides, selector", [
    (dict(capacity="spot"), {"cloud.google.com/gke-spot": "true"}),
    (dict(capacity="reservation", reservation="l4-block"),
     {"cloud.google.com/reservation-name": "l4-block",
      "cloud.google.com/reservation-affinity": "specific"}),
])
def test_gke_cpu_steps_run_on_demand_unless_capacity_cpu_steps(overrides, selector):
    for step in ("train", "evaluate"):
        for pod in _k8s_step_pods(step, **overrides):
            assert selector.items() <= pod["nodeSelector"].items()
    for step in ("data", "tokenize", "export"):
        [pod] = _k8s_step_pods(step, **overrides)
        assert not set(selector) & set(pod.get("nodeSelector", {})), step
        assert all(t["key"] != capacity.GKE_SPOT for t in pod.get("tolerations", ())), step
        [pod] = _k8s_step_pods(step, capacity_cpu_steps=True, **overrides)
        assert selector.items() <= pod["nodeSelector"].items(), step
        assert "cloud.google.com/gke-accelerator" not in pod["nodeSelector"]  # still a CPU pod


def _vertex_step_job(step: str, **overrides):
    from google.cloud.aiplatform_v1 import CustomJob

    cfg = RunConfig(**{**VERTEX, **overrides})
    capacity.check(cfg)
    ctx = ctx_for(cfg.artifact_root)
    [rendered] = backend_for(cfg).render(cfg, ctx, step_spec(cfg, step, ctx.run_uri))
    return CustomJob.from_json(json.dumps(rendered), ignore_unknown_fields=False)


def test_vertex_cpu_steps_run_on_demand_unless_capacity_cpu_steps():
    from google.cloud.aiplatform_v1 import Scheduling

    spot, unset = Scheduling.Strategy.SPOT, Scheduling.Strategy.STRATEGY_UNSPECIFIED
    assert _vertex_step_job("evaluate", capacity="spot").job_spec.scheduling.strategy == spot
    flex = _vertex_step_job("train", capacity="flex_start").job_spec.scheduling.strategy
    assert flex == Scheduling.Strategy.FLEX_START
    for step in ("data", "tokenize", "export"):
        for value in ("spot", "flex_start"):
            job = _vertex_step_job(step, capacity=value)
            assert job.job_spec.scheduling.strategy == unset, (step, value)
        assert _vertex_step_job(step, capacity="spot", capacity_cpu_steps=True
                                ).job_spec.scheduling.strategy == spot
        [pool] = [p for p in _vertex_step_job(step, capacity="reservation",
                                              reservation=RESERVATION).job_spec.worker_pool_specs
                  if p.replica_count]
        assert not pool.machine_spec.reservation_affinity.key
        [pool] = [p for p in _vertex_step_job(
            step, capacity="reservation", reservation=RESERVATION,
            capacity_cpu_steps=True).job_spec.worker_pool_specs if p.replica_count]
        assert list(pool.machine_spec.reservation_affinity.values) == [RESERVATION]


def test_flex_start_refuses_capacity_cpu_steps_naming_the_field():
    with pytest.raises(ConfigError) as err:
        capacity.check(RunConfig(**{**VERTEX, "capacity": "flex_start",
                                    "capacity_cpu_steps": True}))
    assert err.value.field == "capacity_cpu_steps" and "GPU machines only" in str(err.value)


def test_the_dry_run_says_which_steps_run_on_the_capacity():
    for cfg, wanted in (
            (RunConfig(**{**VERTEX, "capacity": "spot"}),
             "capacity spot: train, evaluate; on demand: data, tokenize, export (set "
             "capacity_cpu_steps to put them on the same capacity)"),
            (RunConfig(**{**VERTEX, "capacity": "spot", "capacity_cpu_steps": True}),
             "capacity spot: every step (data, tokenize, train, evaluate, export; "
             "capacity_cpu_steps)")):
        warned = []
        dry_run(cfg, ctx_for("gs://b/r"), warn=warned.append)
        assert wanted in warned
    k8s = RunConfig(provisioner="kubernetes", artifact_root=BUCKET, capacity="spot")
    text = dry_run(k8s, ctx_for(BUCKET), warn=lambda m: 0)
    assert text.startswith("# capacity spot: train, evaluate; on demand: data, tokenize")


# --- the controller: re-provisioning after preemption --------------------------------------
# The stand-in worker: attempt 1 waits for SIGTERM (or is killed), then writes its preemption
# file and exits 75; attempts after the first (BERTFLOW_ATTEMPT) finish at once. Modes:
# "graceful" waits for SIGTERM; "self": worker 0 notices by itself (a maintenance event);
# "always": that, on every attempt; "fail" exits 3 (a real failure); "kill": SIGKILL.
STAND_IN = r"""
import json, os, signal, sys, time
run, mode = sys.argv[1], sys.argv[2]
attempt = int(os.environ["BERTFLOW_ATTEMPT"])
task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {
    "type": os.environ.get("BERTFLOW_TF_ROLE", "worker"),
    "index": int(os.environ.get("JOB_COMPLETION_INDEX", "0"))}
name = f"{task['type']}-{task['index']}"
os.makedirs(f"{run}/train/attempt-log", exist_ok=True)
open(f"{run}/train/attempt-log/{name}-{attempt}", "w").close()
if mode == "fail":
    sys.exit(3)
if mode == "kill" and attempt == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # no notice, nothing saved
if attempt > 1 and mode != "always":  # resumed from the checkpoint: finish
    print(f"{name} resumed on attempt {attempt}", flush=True)
    sys.exit(0)
noticed = []
signal.signal(signal.SIGTERM, lambda *a: noticed.append(time.time()))
print(f"{name} training on attempt {attempt}", flush=True)
while not noticed:
    if mode in ("self", "always") and task["index"] == 0:
        noticed.append(time.time())  # a maintenance event seen by the worker itself
    time.sleep(0.05)
os.makedirs(f"{run}/train/preemption", exist_ok=True)
with open(f"{run}/train/preemption/{name}.json", "w") as f:
    json.dump({"step": 7 * attempt, "signal": "SIGTERM", "noticed_at": noticed[0],
               "saved_at": time.time()}, f)
sys.exit(75)
"""


def stand_in_spec(run_uri: str, mode: str, workers: int = 2) -> WorkerSpec:
    return WorkerSpec(command=["python", "-c", STAND_IN, run_uri, mode], env=dict(BASE_ENV),
                      cluster={"worker": workers} if workers > 1 else {},
                      strategy="multi_worker_mirrored" if workers > 1 else "one_device",
                      step="train", accelerated=True)


def started(run: Path, name: str, attempt: int) -> bool:
    return (run / "train" / "attempt-log" / f"{name}-{attempt}").exists()


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_preempted_exit_code_is_the_contract_value():
    assert PREEMPTED_EXIT_CODE == 75
    assert attempts.outcome_of_exit(75) is attempts.WorkerPreempted
    assert attempts.outcome_of_exit(1) is WorkerError


def local_loop(tmp_path, mode: str, workers: int = 2, **cfg_values):
    cfg = RunConfig(artifact_root=str(tmp_path), **cfg_values)
    ctx = ctx_for(str(tmp_path))
    lines: list[str] = []
    loop = attempts.run_step(LocalBackend(), cfg, ctx, stand_in_spec(ctx.run_uri, mode, workers),
                             log=lines.append, secrets={})
    return loop, ctx, Path(ctx.run_uri), lines


def test_local_workers_exiting_75_are_run_again_and_each_attempt_is_recorded(tmp_path):
    loop, ctx, run, lines = local_loop(tmp_path, "self")
    loop.run()  # worker 0 notices "maintenance" itself, saves and exits 75; attempt 2 resumes
    records = attempts.read_attempts(ctx, "train")
    assert [r["outcome"] for r in records] == ["preempted", "success"]
    assert [r["attempt"] for r in records] == [1, 2]
    for r in records:
        assert r["requested_at"] <= r["running_at"] <= r["ended_at"]
    assert records[0]["ended_at"] <= records[1]["requested_at"]
    assert started(run, "worker-1", 2) and started(run, "worker-0", 2)
    assert any("attempt 1 was preempted" in ln and "max_preemptions 5" in ln for ln in lines)
    assert any("worker-0 resumed on attempt 2" in ln for ln in lines)


def test_a_local_worker_killed_without_notice_is_lost_and_run_again(tmp_path):
    loop, ctx, run, _ = local_loop(tmp_path, "kill", workers=1)
    loop.run()
    assert [r["outcome"] for r in attempts.read_attempts(ctx, "train")] == ["lost", "success"]
    assert not (run / "train" / "preemption").exists()


def test_a_real_failure_is_not_reprovisioned(tmp_path):
    loop, ctx, run, _ = local_loop(tmp_path, "fail", workers=1)
    with pytest.raises(WorkerError) as err:
        loop.run()
    assert not isinstance(err.value, attempts.WorkerPreempted)
    assert "exited with code 3" in str(err.value)
    assert [r["outcome"] for r in attempts.read_attempts(ctx, "train")] == ["failed"]
    assert not started(run, "worker-0", 2)


def test_past_max_preemptions_the_step_fails_naming_the_field(tmp_path):
    loop, ctx, _, _ = local_loop(tmp_path, "always", workers=1, max_preemptions=2)
    with pytest.raises(WorkerError) as err:
        loop.run()
    message = str(err.value)
    assert "max_preemptions (2)" in message and "after 2 re-provisions" in message
    assert [r["outcome"] for r in attempts.read_attempts(ctx, "train")] == ["preempted"] * 3


def test_a_new_task_try_continues_the_attempt_list(tmp_path):
    loop, ctx, _, _ = local_loop(tmp_path, "self", workers=1)
    loop.run()
    again, *_ = local_loop(tmp_path, "self", workers=1)
    again.run()  # attempt 3 is not the first: it finishes at once
    assert [(r["attempt"], r["outcome"]) for r in attempts.read_attempts(ctx, "train")] == [
        (1, "preempted"), (2, "success"), (3, "success")]


# --- Kubernetes fake: a pod deleted with a grace period, a node taken away --------------------
needs_kubelet = pytest.mark.skipif(not ProcessKubelet.available(),
                                   reason="ProcessKubelet needs unshare --mount (root)")


def _pod_of(kube: FakeKube, marker: str) -> str:
    return next(n for n in kube.names("pods") if marker in n)


def run_on_fake_kube(tmp_path, monkeypatch, disrupt, **cfg_values):
    """The stand-in through KubernetesBackend's real controller inside an AttemptLoop; pods
    run as local processes. `disrupt(kube, run)` plays the preemption from another thread."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = RunConfig(provisioner="kubernetes", artifact_root=str(tmp_path / "root"),
                    num_workers=2, strategy="multi_worker_mirrored", **cfg_values)
    ctx = ctx_for(cfg.artifact_root)
    run = Path(ctx.run_uri)
    lines: list[str] = []
    with FakeKube(ProcessKubelet(tmp_path / "kubelet")) as kube:
        monkeypatch.setenv("KUBECONFIG", str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
        backend = KubernetesBackend(poll_seconds=0.1, grace_seconds=10, _shares_host_disk=True)
        loop = attempts.run_step(backend, cfg, ctx, stand_in_spec(ctx.run_uri, "graceful"),
                                 log=lines.append, secrets={})
        thread = threading.Thread(target=disrupt, args=(kube, run, lines), daemon=True)
        thread.start()
        outcome = None
        try:
            loop.run()
        except WorkerError as err:
            outcome = err
        thread.join(timeout=30)
        jobs_created = kube.created_names("jobs")
        assert kube.kubelet.live_processes(wait=20) == []
    return ctx, run, lines, jobs_created, outcome


@needs_kubelet
def test_a_pod_deleted_with_a_grace_period_saves_exits_75_and_is_reprovisioned(
        tmp_path, monkeypatch):
    def disrupt(kube: FakeKube, run: Path, lines: list[str]):
        wait_until(lambda: started(run, "worker-0", 1) and started(run, "worker-1", 1))
        # graceful node shutdown of a spot node: SIGTERM, 30 s grace at most, SIGKILL
        for name in (_pod_of(kube, "-worker-0-"), _pod_of(kube, "-worker-1-")):
            kube.delete_pod_gracefully(name, grace_seconds=30)

    ctx, run, lines, jobs, err = run_on_fake_kube(tmp_path, monkeypatch, disrupt)
    assert err is None, "\n".join(lines[-40:])
    records = attempts.read_attempts(ctx, "train")
    assert [r["outcome"] for r in records] == ["preempted", "success"]
    for r in records:  # the pods ran, even if they ended before a poll saw them both run
        assert r["requested_at"] <= r["running_at"] <= r["ended_at"], r
    assert len(jobs) == 2  # one Job per attempt, same name: the step's pods re-created
    for name in ("worker-0", "worker-1"):
        notice = json.loads((run / "train" / "preemption" / f"{name}.json").read_text())
        assert notice["saved_at"] - notice["noticed_at"] < 30  # within the grace period
        assert started(run, name, 2)


@needs_kubelet
def test_a_node_taken_away_loses_its_pod_and_the_step_is_reprovisioned(tmp_path, monkeypatch):
    def disrupt(kube: FakeKube, run: Path, lines: list[str]):
        # Both pods seen by the controller (their logs stream), not only started: a pod that
        # vanishes before the controller ever saw it looks like one never created.
        wait_until(lambda: started(run, "worker-0", 1) and started(run, "worker-1", 1) and
                   any(ln.startswith("[worker:1]") for ln in lines))
        kube.remove_node([_pod_of(kube, "-worker-1-")])  # no notice: SIGKILL, pod gone

    ctx, run, lines, jobs, err = run_on_fake_kube(tmp_path, monkeypatch, disrupt)
    assert err is None, "\n".join(lines[-40:])
    records = attempts.read_attempts(ctx, "train")
    assert [r["outcome"] for r in records] == ["lost", "success"]
    assert any("pod disappeared" in ln and "provisioning again" in ln for ln in lines)
    assert not (run / "train" / "preemption" / "worker-1.json").exists()
    assert started(run, "worker-1", 2)


@needs_kubelet
def test_kubernetes_past_the_bound_fails_with_the_field(tmp_path, monkeypatch):
    def disrupt(kube: FakeKube, run: Path, lines: list[str]):
        wait_until(lambda: started(run, "worker-1", 1) and
                   any(ln.startswith("[worker:1]") for ln in lines))
        kube.remove_node([_pod_of(kube, "-worker-1-")])

    ctx, _, _, jobs, err = run_on_fake_kube(tmp_path, monkeypatch, disrupt, max_preemptions=0)
    assert err is not None and "max_preemptions (0)" in str(err)
    assert [r["outcome"] for r in attempts.read_attempts(ctx, "train")] == ["lost"]
    assert len(jobs) == 1


# --- Vertex AI fake: a preempted job is submitted again -------------------------------------
def test_a_preempted_vertex_job_is_submitted_again(tmp_path, monkeypatch):
    """The fake Vertex AI fails the first job as a spot reclaim does once its workers have
    saved (the stand-in's preemption file is written as a worker would); the controller
    submits a new CustomJob, which succeeds. The real JobServiceClient talks to the fake."""
    server = FakeVertex().start()
    try:
        monkeypatch.setenv(vertex_client.ENDPOINT_ENV, server.endpoint)
        monkeypatch.setattr(vertex_ai, "POLL_MIN_SECONDS", 0.01)
        monkeypatch.setattr(vertex_ai, "POLL_MAX_SECONDS", 0.05)
        cfg = RunConfig(**{**VERTEX, "artifact_root": str(tmp_path), "capacity": "spot"})
        ctx = ctx_for(str(tmp_path))
        preemption = Path(ctx.step_uri("train")) / "preemption" / "chief-0.json"
        first = ["JOB_STATE_PENDING"] + ["JOB_STATE_RUNNING"] * 60 + [
                 ("JOB_STATE_FAILED", "The replica workerpool0-0 exited with a non-zero "
                                      "status of 75.")]
        server.script = first

        def preempt_while_running():
            wait_until(lambda: any(s == "JOB_STATE_RUNNING" for s in
                                   map(server.state, list(server.jobs))))
            preemption.parent.mkdir(parents=True, exist_ok=True)
            preemption.write_text(json.dumps({"step": 5, "signal": "SIGTERM",
                                              "noticed_at": 1.0, "saved_at": 2.0}))
            server.script = ["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]

        thread = threading.Thread(target=preempt_while_running, daemon=True)
        thread.start()
        lines: list[str] = []
        spec = distributed_spec(cfg, "train", ctx.run_uri)
        attempts.run_step(backend_for(cfg), cfg, ctx, spec, log=lines.append,
                          secrets={}).run()
        thread.join(timeout=10)
        records = attempts.read_attempts(ctx, "train")
        assert [r["outcome"] for r in records] == ["preempted", "success"]
        assert len(server.jobs) == 2
        envs = [{e.name: e.value for e in job.job_spec.worker_pool_specs[0].container_spec.env}
                for job in server.jobs.values()]
        assert sorted(env["BERTFLOW_ATTEMPT"] for env in envs) == ["1", "2"]
        assert all(job.job_spec.scheduling.strategy.name == "SPOT"
                   for job in server.jobs.values())
    finally:
        server.stop()


# --- the DAG's operator ------------------------------------------------------------------
def test_the_dag_operator_rides_out_a_preemption_within_one_try(tmp_path):
    """WorkerStepOperator.execute (the DAG's train task) runs the stand-in: attempt 1 is
    preempted, attempt 2 resumes and writes the step manifest; execute returns it, so the
    Airflow task succeeds on the try it is in and spends no retry."""
    from airflow.dag_processing.dagbag import DagBag

    from tasks.io import storage
    from tasks.runs.runlayout import init_run

    dags = Path(__file__).resolve().parent.parent / "dags"
    operator_class = type(DagBag(dag_folder=str(dags)).dags["bert_finetune"].get_task("train"))
    cfg = parse_config({"artifact_root": str(tmp_path)})
    ctx = RunContext(str(tmp_path), "bert_finetune", "manual_op", "manual_op")
    init_run(cfg, ctx)
    finish = STAND_IN.replace('print(f"{name} resumed on attempt {attempt}", flush=True)',
                              'open(f"{run}/train/manifest.json", "w").write("{}")')
    spec = stand_in_spec(ctx.run_uri, "self")
    spec = WorkerSpec(**{**spec.to_dict(), "command": ["python", "-c", finish, ctx.run_uri,
                                                       "self"]})
    storage.write_json(ctx.manifest_uri("provision"), {"workers": {"train": spec.to_dict()}})
    op = operator_class(task_id="train", step="train", run_uri=ctx.run_uri, distributed=True)
    assert op.execute(context={}) == ctx.manifest_uri("train")
    assert [r["outcome"] for r in attempts.read_attempts(ctx, "train")] == ["preempted",
                                                                            "success"]


# --- Kubernetes fake, scripted pods: how the controller reads a pod's end -------------------
@pytest.mark.parametrize("end, outcome", [
    (lambda pod: pod.fail(exit_code=PREEMPTED_EXIT_CODE), "preempted"),
    (lambda pod: pod.preempt(), "lost"),  # DisruptionTarget, exit 137: no save
    (lambda pod: pod.evict(), "lost"),
    (lambda pod: pod.fail(exit_code=1), "failed"),
])
def test_kubernetes_pod_endings_are_told_apart(tmp_path, monkeypatch, end, outcome):
    """Scripted pods (no processes): worker 1's first-attempt pod ends as given; later pods
    succeed. Only a real failure fails the step."""
    def script(pod):
        pod.schedule()
        pod.run()
        attempt = pod.environment()["BERTFLOW_ATTEMPT"]
        time.sleep(0.3)
        if attempt == "1" and pod.index == 1:
            return end(pod)
        pod.succeed()

    ctx, pods, error = _scripted_spot_step(tmp_path, monkeypatch, script,
                                           KubernetesBackend(poll_seconds=0.05, grace_seconds=5))
    if outcome == "failed":
        assert isinstance(error, WorkerError) and "exit code 1" in str(error), error
    else:
        assert error is None, error
    records = attempts.read_attempts(ctx, "train")
    assert [r["outcome"] for r in records] == [outcome] + ([] if outcome == "failed"
                                                           else ["success"])
    spot_pods = [o for o in pods if o["kind"] == "Pod"]
    assert spot_pods and all(o["spec"]["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
                             for o in spot_pods)


def _scripted_spot_step(tmp_path, monkeypatch, script, backend: KubernetesBackend,
                        log=lambda line: None):
    """The spot train step of 2 MWMS workers through `backend`'s real controller in an
    AttemptLoop, on pods played by `script`: (ctx, objects created, the step's WorkerError)."""
    from fake_kubernetes import ScriptedKubelet

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = RunConfig(provisioner="kubernetes", artifact_root=BUCKET, num_workers=2,
                    strategy="multi_worker_mirrored", capacity="spot")
    ctx = RunContext(artifact_root=str(tmp_path), dag_id="bert_finetune", run_key="run1")
    error = None
    with FakeKube(ScriptedKubelet(script)) as kube:
        monkeypatch.setenv("KUBECONFIG", str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
        try:
            attempts.run_step(backend, cfg, ctx, distributed_spec(cfg, "train", ctx.run_uri),
                              log=log, secrets={}).run()
        except WorkerError as err:
            error = err
        created = kube.created
    return ctx, created, error


def test_pods_preempted_between_two_polls_still_record_when_they_ran(tmp_path, monkeypatch):
    """Issue 47: attempt 1's pods start and are preempted (exit 75) between two polls of the
    controller (its default poll_seconds, 2 s), so no poll sees them running. The attempt still
    ran: its running_at comes from the containers' startedAt (kept in their terminated
    state), or goodput would count the whole attempt as waiting for capacity."""
    runs: list[float] = []  # attempt 1: when each pod started, when each was preempted
    ends: list[float] = []

    def script(pod):
        pod.schedule()
        if pod.environment()["BERTFLOW_ATTEMPT"] == "1":
            time.sleep(1.0)  # the first poll, right after the Job's creation, sees them pending
            runs.append(time.time())
            pod.run()
            time.sleep(0.2)
            ends.append(time.time())
            return pod.fail(exit_code=PREEMPTED_EXIT_CODE)
        pod.run()
        time.sleep(0.3)
        pod.succeed()

    lines: list[str] = []
    ctx, _, error = _scripted_spot_step(tmp_path, monkeypatch, script, KubernetesBackend(),
                                        log=lines.append)
    assert error is None, error
    first, second = attempts.read_attempts(ctx, "train")
    assert (first["outcome"], second["outcome"]) == ("preempted", "success"), lines
    assert len(runs) == 2 and first["running_at"] is not None, (first, lines)
    # The later start (startedAt has whole seconds, as a kubelet's), never before the request
    assert max(first["requested_at"], int(max(runs))) <= first["running_at"] <= max(ends)
    assert second["requested_at"] <= second["running_at"] <= second["ended_at"]
