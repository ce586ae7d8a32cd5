"""The Vertex AI backend against a fake JobService (tests/fake_vertex.py) that the real
google-cloud-aiplatform JobServiceClient talks to over HTTP (REST transport), plus the jobs it
renders. No TensorFlow, no cloud."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fake_vertex import FakeVertex
from tasks.config import PROJECT_ROOT, RunConfig
from tasks.errors import ConfigError, WorkerError
from tasks.provision.spec import step_spec
from tasks.provision.vertex_ai import backend as vertex_ai
from tasks.provision.vertex_ai import client as vertex_client
from tasks.provision.backends import backend_for, to_text
from tasks.runs.runlayout import RunContext, init_run

SECRET_VALUES = ("SECRET-TOKEN-4711", "PRIVATE-KEY-0815")
SECRETS = {"AIRFLOW_CONN_GCP": json.dumps({
    "conn_type": "google_cloud_platform", "password": SECRET_VALUES[0],
    "extra": {"keyfile_dict": {"private_key": SECRET_VALUES[1]}}})}
VERTEX = dict(provisioner="vertex_ai", gcp_project="proj", gcp_region="us-central1",
              image_registry="us-docker.pkg.dev/proj/repo")


def pointed_at(server: FakeVertex, monkeypatch) -> FakeVertex:
    """`server` started, the client and the controller's quick polls pointed at it."""
    server.start()
    monkeypatch.setenv(vertex_client.ENDPOINT_ENV, server.endpoint)
    monkeypatch.setattr(vertex_ai, "POLL_MIN_SECONDS", 0.01)
    monkeypatch.setattr(vertex_ai, "POLL_MAX_SECONDS", 0.05)
    return server


@pytest.fixture
def fake(monkeypatch):
    server = pointed_at(FakeVertex(), monkeypatch)
    yield server
    server.stop()


def make(tmp_path, **overrides) -> tuple[RunConfig, RunContext]:
    # A local artifact root: the controller itself writes its record through the storage
    # interface, so the scheme does not matter here (check() is what refuses local folders).
    cfg = RunConfig(**{**VERTEX, "artifact_root": str(tmp_path), **overrides})
    ctx = RunContext(artifact_root=str(tmp_path), dag_id="bert_finetune", run_key="run1")
    return cfg, ctx


def run_controller(cfg, ctx, step="train", secrets=None):
    lines: list[str] = []
    backend = backend_for(cfg)
    ctrl = backend.controller(cfg, ctx, step_spec(cfg, step, ctx.run_uri), log=lines.append,
                              secrets=secrets or {})
    return ctrl, lines


def pools(job: dict) -> list[dict]:
    return job["jobSpec"]["workerPoolSpecs"]


def render(cfg, ctx, step="train") -> dict:
    [job] = backend_for(cfg).render(cfg, ctx, step_spec(cfg, step, ctx.run_uri))
    return job


# --- lifecycle --------------------------------------------------------------------------------
def test_create_poll_succeed_logs_the_job_and_records_it(fake, tmp_path):
    cfg, ctx = make(tmp_path, num_workers=2)
    ctrl, lines = run_controller(cfg, ctx)
    ctrl.run()
    [name] = fake.created()
    assert name.startswith("projects/proj/locations/us-central1/customJobs/")
    job_id = name.rsplit("/", 1)[1]
    console = (f"https://console.cloud.google.com/vertex-ai/locations/us-central1/training/"
               f"{job_id}/cpu?project=proj")
    assert f"[vertex] created {name}" in lines and f"[vertex] console: {console}" in lines
    assert any("Cloud Logging" in ln and job_id in ln for ln in lines)
    assert [ln for ln in lines if ln.startswith("[vertex] JOB_STATE")] == [
        "[vertex] JOB_STATE_PENDING", "[vertex] JOB_STATE_RUNNING",
        "[vertex] JOB_STATE_SUCCEEDED"]
    record = json.loads(Path(ctx.step_uri("provision"), "vertex", "train.json").read_text())
    assert record["job"] == name and record["console_url"] == console
    assert record["state"] == "JOB_STATE_SUCCEEDED"
    # What the fake received is the job the dry run renders (the project filled in).
    sent = json.loads(next(b for m, p, b in fake.requests if m == "POST"))
    assert [p["replicaCount"] for p in sent["jobSpec"]["workerPoolSpecs"]] == ["1", "1"]
    assert sent["labels"]["bertflow-step"] == "train" and not fake.cancels


def test_a_flaky_api_is_polled_again_and_the_job_still_succeeds(fake, tmp_path):
    fake.get_errors = vertex_ai.MAX_POLL_ERRORS  # in a row: one fewer than the step fails on
    ctrl, lines = run_controller(*make(tmp_path))
    ctrl.run()
    assert lines.count("[vertex] polling failed (ServiceUnavailable); retrying") == \
        vertex_ai.MAX_POLL_ERRORS
    assert "[vertex] JOB_STATE_SUCCEEDED" in lines and fake.get_errors == 0


def test_an_api_that_keeps_failing_fails_the_step_naming_the_job(fake, tmp_path):
    fake.get_errors = vertex_ai.MAX_POLL_ERRORS + 1
    ctrl, lines = run_controller(*make(tmp_path))
    with pytest.raises(WorkerError, match=rf"cannot read Vertex AI job \S+ after "
                                          rf"{vertex_ai.MAX_POLL_ERRORS + 1} tries: the service "
                                          "is currently unavailable"):
        ctrl.run()


def test_failed_job_raises_with_vertex_message(fake, tmp_path):
    fake.script = ["JOB_STATE_PENDING", "JOB_STATE_RUNNING",
                   ("JOB_STATE_FAILED", "The replica workerpool0-0 exited with a non-zero "
                                        "status of 2. bertflow: error: train failed")]
    ctrl, lines = run_controller(*make(tmp_path))
    with pytest.raises(WorkerError, match="workerpool0-0 exited with a non-zero status of 2"):
        ctrl.run()


def test_stop_from_another_thread_cancels_the_running_job(fake, tmp_path):
    fake.script = ["JOB_STATE_PENDING", "JOB_STATE_RUNNING"]  # runs until cancelled
    ctrl, lines = run_controller(*make(tmp_path))
    outcome = {}

    def target():
        try:
            ctrl.run()
        except WorkerError as err:
            outcome["error"] = err

    thread = threading.Thread(target=target)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (
            fake.created() and fake.state(fake.created()[0]) == "JOB_STATE_RUNNING"):
        time.sleep(0.01)
    ctrl.stop()  # Airflow's on_kill
    thread.join(timeout=30)
    assert not thread.is_alive() and "stopped" in str(outcome["error"])
    [name] = fake.created()
    assert name in fake.cancels and fake.state(name) == "JOB_STATE_CANCELLED"


def test_waiting_past_schedule_timeout_cancels_with_a_clear_error(fake, tmp_path):
    fake.script = ["JOB_STATE_QUEUED"]  # never gets machines
    cfg, ctx = make(tmp_path, accelerator="gpu", accelerator_type="NVIDIA_H100_80GB")
    # model_copy skips validation: below the field's 10 s minimum, to keep the test fast.
    cfg = cfg.model_copy(update={"schedule_timeout_seconds": 0.3})
    ctrl, _ = run_controller(cfg, ctx)
    with pytest.raises(WorkerError) as err:
        ctrl.run()
    message = str(err.value)
    assert "JOB_STATE_QUEUED" in message and "schedule_timeout_seconds" in message
    assert "a3-highgpu-1g with 1 x NVIDIA_H100_80GB in us-central1" in message
    [name] = fake.created()
    assert fake.cancels == [name]


def test_retry_cancels_the_job_of_a_dead_earlier_attempt(fake, tmp_path):
    fake.script = ["JOB_STATE_RUNNING"]
    cfg, ctx = make(tmp_path)
    ctrl, _ = run_controller(cfg, ctx)
    thread = threading.Thread(target=lambda: pytest.raises(WorkerError, ctrl.run))
    thread.start()
    while not fake.created():
        time.sleep(0.01)
    first = fake.created()[0]
    while not Path(vertex_ai.record_uri(ctx, "train")).exists():
        time.sleep(0.01)
    fake.script = ["JOB_STATE_SUCCEEDED"]
    retry, lines = run_controller(cfg, ctx)
    retry.run()
    assert fake.cancels[0] == first and any("earlier attempt" in ln for ln in lines)
    ctrl.stop()
    thread.join(timeout=30)


CRASHING_CONTROLLER = """
import sys
from tasks.provision.spec import step_spec
from tasks.provision.vertex_ai import backend as vertex_ai
from tasks.provision.vertex_ai import client as vertex_client
from tasks.provision.backends import backend_for
from tasks.runs.runlayout import load_run
vertex_ai.POLL_MIN_SECONDS = vertex_ai.POLL_MAX_SECONDS = 0.05
cfg, ctx = load_run(sys.argv[1])
backend_for(cfg).controller(cfg, ctx, step_spec(cfg, "train", ctx.run_uri), log=print,
                            secrets={}).run()
"""


@pytest.mark.parametrize("lost_record", [False, True], ids=["by-record", "by-label"])
def test_release_after_a_controller_crash_cancels_the_running_job(fake, tmp_path, lost_record):
    fake.script = ["JOB_STATE_RUNNING"]
    cfg, ctx = make(tmp_path, num_workers=2)
    init_run(cfg, ctx)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_CONTROLLER, ctx.run_uri], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    record = Path(vertex_ai.record_uri(ctx, "train"))
    deadline = time.monotonic() + 60
    while not record.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert record.exists(), proc.communicate()[0]
    proc.kill()  # the Airflow worker dies: nobody calls stop()
    proc.wait()
    [name] = fake.created()
    assert fake.state(name) == "JOB_STATE_RUNNING" and not fake.cancels
    if lost_record:
        record.unlink()

    released = backend_for(cfg).release(cfg, ctx, log=lambda _: None)
    assert released == {"cancelled_jobs": [name]}
    assert fake.state(name) == "JOB_STATE_CANCELLED"
    assert any(m == "GET" and "filter=" in p for m, p, _ in fake.requests)
    # Idempotent: a second teardown finds nothing alive.
    assert backend_for(cfg).release(cfg, ctx, log=lambda _: None) == {"cancelled_jobs": []}


def test_sweep_cancels_labelled_jobs_alive_past_the_worker_timeout(fake, tmp_path):
    import datetime as dt

    fake.script = ["JOB_STATE_RUNNING"]
    cfg, ctx = make(tmp_path, worker_timeout_minutes=60)
    client = vertex_client.job_client(cfg)
    for step in ("train", "evaluate"):
        client.create_custom_job(parent="projects/proj/locations/us-central1",
                                 custom_job=vertex_ai.custom_job(cfg, ctx,
                                                                 step_spec(cfg, step,
                                                                           ctx.run_uri)))
    old, new = fake.created()
    with fake.lock:
        fake.jobs[old].create_time = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=2)
    assert backend_for(cfg).sweep(cfg, log=lambda _: None) == [old]
    assert fake.state(old) == "JOB_STATE_CANCELLED" and fake.state(new) == "JOB_STATE_RUNNING"


def test_no_secret_reaches_the_job_the_requests_the_log_or_the_records(fake, tmp_path):
    cfg, ctx = make(tmp_path, gcp_conn_id="gcp", num_workers=2, num_ps=1,
                    strategy="parameter_server")
    ctrl, lines = run_controller(cfg, ctx, secrets=SECRETS)
    ctrl.run()
    assert sum("not passed to Vertex AI workers" in ln for ln in lines) == 1
    texts = ["\n".join(lines), json.dumps(render(cfg, ctx)),
             *(body + path for _, path, body in fake.requests),
             *(p.read_text() for p in Path(ctx.step_uri("provision")).rglob("*.json"))]
    for text in texts:
        for secret in SECRET_VALUES:
            assert secret not in text
    # The workers get a keyless connection: storage there uses the job's service account.
    env = {e["name"]: e["value"] for e in pools(render(cfg, ctx))[0]["containerSpec"]["env"]}
    assert json.loads(env["AIRFLOW_CONN_GCP"]) == {"conn_type": "google_cloud_platform",
                                                   "extra": {"project": "proj"}}


# --- rendered jobs ----------------------------------------------------------------------------
def test_mwms_pools_chief_then_workers(tmp_path):
    cfg, ctx = make(tmp_path, num_workers=3, service_account="sa@proj.iam.gserviceaccount.com",
                    network="projects/1/global/networks/vpc", worker_timeout_minutes=90)
    job = render(cfg, ctx)
    assert [p["replicaCount"] for p in pools(job)] == ["1", "2"]
    for pool in pools(job):
        assert pool["machineSpec"] == {"machineType": "n1-standard-8"}
        # The step's command, under the writer that keeps the replica's log in the run
        # folder (the controller cannot read Cloud Logging).
        assert pool["containerSpec"]["command"] == [
            "python", "-m", "tasks.provision.worker_logs", "--run-dir", ctx.run_uri,
            "--step", "train", "--", "python", "-m", "tasks", "train", "--run-dir", ctx.run_uri]
        assert pool["containerSpec"]["imageUri"] == (
            "us-docker.pkg.dev/proj/repo/bertflow-trainer-cpu:" + __import__("tasks").__version__)
    spec = job["jobSpec"]
    assert spec["serviceAccount"] == "sa@proj.iam.gserviceaccount.com"
    assert spec["network"] == "projects/1/global/networks/vpc"
    # MWMS workers cannot rejoin the all-reduce: a restarted worker restarts the whole job.
    assert spec["scheduling"] == {"timeout": "5400s", "restartJobOnWorkerRestart": True}
    assert spec["baseOutputDirectory"]["outputUriPrefix"] == ctx.step_uri("train") + "/vertex"
    assert job["labels"] == {"managed-by": "bertflow", "bertflow-run": vertex_ai.run_label(ctx),
                             "bertflow-dag": "bert_finetune", "bertflow-step": "train"}
    assert job["displayName"] == "bertflow-bert_finetune-run1-train"


def test_parameter_server_pools_chief_workers_ps(tmp_path):
    cfg, ctx = make(tmp_path, num_workers=2, num_ps=1, strategy="parameter_server",
                    accelerator="gpu", accelerator_type="NVIDIA_L4", devices_per_worker=2)
    found = pools(render(cfg, ctx))
    assert [p["replicaCount"] for p in found] == ["1", "2", "1"]
    gpu = {"machineType": "g2-standard-24", "acceleratorType": "NVIDIA_L4",
           "acceleratorCount": 2}
    # The chief only coordinates (ParameterServerStrategy's ClusterCoordinator): no GPU.
    cpu = {"machineType": "n1-standard-8"}
    assert [p["machineSpec"] for p in found] == [cpu, gpu, cpu]
    assert found[0]["containerSpec"]["imageUri"].endswith(
        "/bertflow-trainer-gpu:" + __import__("tasks").__version__)
    # Its workers and ps come and go (the coordinator reschedules): no whole-job restart.
    assert "restartJobOnWorkerRestart" not in render(cfg, ctx)["jobSpec"]["scheduling"]


def test_single_process_jobs_do_not_restart_the_job_on_worker_restart(tmp_path):
    cfg, ctx = make(tmp_path, accelerator="gpu", accelerator_type="NVIDIA_L4",
                    devices_per_worker=2, strategy="mirrored")
    for step in ("train", "tokenize"):
        assert render(cfg, ctx, step)["jobSpec"]["scheduling"] == {"timeout": "86400s"}


def test_the_submitted_jobs_carry_the_restart_policy_and_the_cpu_chief(fake, tmp_path):
    """Through the real client to the fake JobService: what Vertex AI receives."""
    for overrides, restart, chief in (
            (dict(num_workers=2), True, {"machineType": "n1-standard-8"}),
            (dict(num_workers=2, num_ps=1, strategy="parameter_server", accelerator="gpu",
                  accelerator_type="NVIDIA_L4"), None, {"machineType": "n1-standard-8"})):
        cfg, ctx = make(tmp_path / str(restart), **overrides)
        fake.requests.clear()
        run_controller(cfg, ctx)[0].run()
        sent = json.loads(next(b for m, p, b in fake.requests if m == "POST"))
        assert sent["jobSpec"]["scheduling"].get("restartJobOnWorkerRestart") is restart
        assert sent["jobSpec"]["workerPoolSpecs"][0]["machineSpec"] == chief


def test_single_process_steps_render_one_cpu_pool(tmp_path):
    cfg, ctx = make(tmp_path, accelerator="gpu", accelerator_type="NVIDIA_L4")
    train = pools(render(cfg, ctx, "train"))
    assert len(train) == 1 and train[0]["replicaCount"] == "1"
    assert train[0]["machineSpec"] == {"machineType": "g2-standard-8",
                                       "acceleratorType": "NVIDIA_L4", "acceleratorCount": 1}
    for step in ("tokenize", "export"):
        [pool] = pools(render(cfg, ctx, step))
        assert pool["replicaCount"] == "1" and pool["machineSpec"] == {
            "machineType": "n1-standard-8"}


def test_tpu_pool_has_machine_type_and_topology(tmp_path):
    cfg, ctx = make(tmp_path, accelerator="tpu", accelerator_type="TPU_V5_LITEPOD",
                    tpu_topology="2x2", tpu_address="local")
    [pool] = pools(render(cfg, ctx))
    assert pool["machineSpec"] == {"machineType": "ct5lp-hightpu-4t",
                                   "acceleratorType": "TPU_V5_LITEPOD", "acceleratorCount": 4,
                                   "tpuTopology": "2x2"}
    assert "bertflow-trainer-tpu" in pool["containerSpec"]["imageUri"]
    cfg, ctx = make(tmp_path, accelerator="tpu", accelerator_type="TPU_V3", tpu_address="local")
    assert pools(render(cfg, ctx))[0]["machineSpec"] == {
        "machineType": "cloud-tpu", "acceleratorType": "TPU_V3", "acceleratorCount": 8}


@pytest.mark.parametrize("values, field, words", [
    (dict(accelerator_type="nvidia-l4"), "accelerator_type", "NVIDIA_L4, NVIDIA_H100_80GB"),
    (dict(accelerator="gpu"), "accelerator_type", "needs an accelerator type"),
    (dict(accelerator="gpu", accelerator_type="TPU_V3"), "accelerator_type", "does not match"),
    (dict(accelerator_type="NVIDIA_L4", devices_per_worker=3), "machine_type", "3 x NVIDIA_L4"),
    (dict(gcp_region=""), "gcp_region", "region"),
    (dict(image_registry=""), "worker_image", "registry"),
    (dict(artifact_root="s3://bucket/root"), "artifact_root", "gs://"),
])
def test_config_problems_name_the_field(tmp_path, values, field, words):
    cfg, ctx = make(tmp_path, **{"artifact_root": "gs://bucket/root", **values})
    with pytest.raises(ConfigError) as err:
        backend_for(cfg).check(cfg, ctx)
    assert err.value.field == field and words in str(err.value)


@pytest.mark.parametrize("tpu", ["TPU_V4_POD"])
def test_tpus_vertex_ai_does_not_train_tensorflow_on_are_refused(tmp_path, tpu):
    cfg, ctx = make(tmp_path, accelerator="tpu", accelerator_type=tpu, artifact_root="gs://b/r",
                    image_registry="us-docker.pkg.dev/p/r")
    with pytest.raises(ConfigError) as err:
        backend_for(cfg).check(cfg, ctx)
    assert err.value.field == "accelerator_type"
    assert f"does not train TensorFlow on {tpu}" in str(err.value)
    assert "TPU_V2, TPU_V3, TPU_V5_LITEPOD" in str(err.value) and "tpu_vm" in str(err.value)


@pytest.mark.parametrize("tpu", ["TPU_V2", "TPU_V3", "TPU_V5_LITEPOD"])
def test_the_tpus_of_vertex_ais_tensorflow_page_pass(tmp_path, tpu):
    cfg, ctx = make(tmp_path, accelerator="tpu", accelerator_type=tpu, artifact_root="gs://b/r",
                    image_registry="us-docker.pkg.dev/p/r")
    assert backend_for(cfg).check(cfg, ctx) == []


def test_remote_check_passes_for_a_complete_config(tmp_path):
    cfg, ctx = make(tmp_path, artifact_root="gs://bucket/root")
    assert backend_for(cfg).check(cfg, ctx) == []


# --- CLI --------------------------------------------------------------------------------------
def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tasks", *args], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)


def test_dry_run_cli_prints_jobs_and_a_real_run_refuses_a_local_folder(tmp_path):
    run_dir = str(tmp_path / "runs" / "bert_finetune" / "try1")
    done = cli("init-run", "--run-dir", run_dir, "--provisioner", "vertex_ai",
               "--gcp-region", "us-central1", "--image-registry", "eu.gcr.io/p",
               "--num-workers", "2")
    assert done.returncode == 0, done.stderr
    done = cli("provision", "--dry-run", "--run-dir", run_dir)
    assert done.returncode == 0, done.stderr
    jobs = json.loads(done.stdout)
    assert [j["labels"]["bertflow-step"] for j in jobs] == ["data", "tokenize", "train",
                                                            "evaluate", "export"]
    assert [len(pools(j)) for j in jobs] == [1, 1, 2, 2, 1]
    assert "warning: artifact_root" in done.stderr and "local path" in done.stderr
    text = to_text(backend_for(RunConfig(provisioner="vertex_ai")), jobs)
    assert json.loads(text) == jobs

    done = cli("provision", "--run-dir", run_dir)
    assert done.returncode == 2
    assert "artifact_root" in done.stderr and "local path" in done.stderr
