"""Every worker's log is kept in the run folder, `{run}/{step}/logs/{role}-{index}.log`, also
when the step fails or is stopped:

- local processes: real processes, run folders on local disk, the GCS emulator and moto's S3
  (tests/storage_servers.py);
- Kubernetes: the real `kubernetes` client against the fake API server on loopback
  (tests/fake_kubernetes.py, its scripted kubelet plays the pods), run folder on the GCS
  emulator: the files exist before the pods are deleted; `release` keeps the logs of pods a
  dead controller left;
- Vertex AI: the rendered CustomJob's replicas run as local processes with the TF_CONFIG
  Vertex AI writes (VertexReplicas from tests/test_vertex_ai_train.py): each replica's
  worker-side writer keeps its own file, also when it is sent SIGTERM.

The TPU VM's agent is tested in tests/test_tpu_vm.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from fake_kubernetes import FakeKube, FakePod, ScriptedKubelet
from storage_servers import BUCKET, connections, gcs_emulator, root, s3_server  # noqa: F401
from tasks.config import PROJECT_ROOT, RunConfig, parse_config
from tasks.errors import WorkerError
from tasks.io import storage
from tasks.provision.kubernetes import render
from tasks.provision.backends import backend_for
from tasks.provision.kubernetes.backend import KubernetesBackend
from tasks.provision.spec import WorkerSpec, single_process_spec
from tasks.provision import attempts
from tasks.provision.worker_logs import attempt_logs, log_uri, worker_identity
from tasks.runs.runlayout import RunContext, init_run
from test_vertex_ai_train import VERTEX, VertexReplicas

# Worker 1 fails after two lines; worker 0 says hello and keeps serving until stopped.
TWO_WORKERS = """
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
print(f"hello from {task['type']} {task['index']}", flush=True)
if task["index"] == 1:
    print("loading shard 3", flush=True)
    print("bad label 7 in shard 3", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(60)
"""


def read(uri: str) -> str:
    return storage.read_text(uri)


# --- local processes --------------------------------------------------------------------------
def test_local_workers_logs_are_kept_when_one_fails(root):  # noqa: F811
    cfg = parse_config({"artifact_root": root})
    ctx = RunContext(root, "bert_finetune", f"manual__{uuid.uuid4().hex[:6]}")
    spec = WorkerSpec(command=["python", "-c", TWO_WORKERS], cluster={"worker": 2},
                      strategy="multi_worker_mirrored", step="train")
    lines: list[str] = []
    with pytest.raises(WorkerError, match="worker:1 exited with code 3"):
        backend_for(cfg).controller(cfg, ctx, spec, log=lines.append, secrets={}).run()
    assert read(log_uri(ctx.run_uri, "train", "worker", 0)) == "hello from worker 0\n"
    # stdout and stderr, in order, without the controller's [role:i] prefix.
    assert read(log_uri(ctx.run_uri, "train", "worker", 1)) == (
        "hello from worker 1\nloading shard 3\nbad label 7 in shard 3\n")
    assert sorted(storage.list_uris(ctx.step_uri("train") + "/logs/")) == [
        log_uri(ctx.run_uri, "train", "worker", i) for i in (0, 1)]


# Attempt 1 of each worker is preempted (exit 75, as after a notice); attempt 2 succeeds.
PREEMPTED_ONCE = """
import json, os, sys
task = json.loads(os.environ["TF_CONFIG"])["task"]
attempt = os.environ["BERTFLOW_ATTEMPT"]
print(f"{task['type']} {task['index']} attempt {attempt}", flush=True)
sys.exit(75 if attempt == "1" else 0)
"""


def test_every_attempt_keeps_its_own_log_and_the_plain_file_is_the_newest(root):  # noqa: F811
    cfg = parse_config({"artifact_root": root, "max_preemptions": 3})
    ctx = RunContext(root, "bert_finetune", f"manual__{uuid.uuid4().hex[:6]}")
    spec = WorkerSpec(command=["python", "-c", PREEMPTED_ONCE], cluster={"worker": 2},
                      strategy="multi_worker_mirrored", step="train")
    attempts.run_step(backend_for(cfg), cfg, ctx, spec, log=lambda line: None,
                      secrets={}).run()
    assert [a["outcome"] for a in attempts.read_attempts(ctx, "train")] == [
        "preempted", "success"]
    for i in (0, 1):
        for n in (1, 2):
            assert read(log_uri(ctx.run_uri, "train", "worker", i, n)) == \
                f"worker {i} attempt {n}\n"
        assert read(log_uri(ctx.run_uri, "train", "worker", i)) == f"worker {i} attempt 2\n"
    assert attempt_logs(ctx.run_uri, "train") == {
        f"worker-{i}": {n: log_uri(ctx.run_uri, "train", "worker", i, n) for n in (1, 2)}
        for i in (0, 1)}
    # A new Airflow try continues the numbering: attempt 3 adds files, 1 and 2 stay.
    attempts.run_step(backend_for(cfg), cfg, ctx, spec, log=lambda line: None,
                      secrets={}).run()
    assert list(attempt_logs(ctx.run_uri, "train")["worker-0"]) == [1, 2, 3]
    assert read(log_uri(ctx.run_uri, "train", "worker", 0, 1)) == "worker 0 attempt 1\n"


# --- Kubernetes -------------------------------------------------------------------------------
@pytest.fixture
def gs_run(gcs_emulator, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    root = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    cfg = RunConfig(provisioner="kubernetes", artifact_root=root, num_workers=2,
                    strategy="multi_worker_mirrored")
    ctx = RunContext(artifact_root=root, dag_id="bert_finetune", run_key="manual__k8s")
    kubes = []

    def start(script) -> FakeKube:
        kube = FakeKube(ScriptedKubelet(script)).__enter__()
        kubes.append(kube)
        monkeypatch.setenv("KUBECONFIG", str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
        return kube

    yield cfg, ctx, start
    for kube in kubes:
        kube.__exit__(None, None, None)


def test_kubernetes_pod_logs_are_kept_before_the_failed_step_is_deleted(gs_run):
    cfg, ctx, start = gs_run
    at_delete: dict[int, str | None] = {}

    def script(pod: FakePod) -> None:
        uri = log_uri(ctx.run_uri, "train", pod.role, pod.index)
        # What the run folder holds at the moment the controller deletes this pod.
        pod.on_delete(lambda: at_delete.setdefault(
            pod.index, read(uri) if storage.exists(uri) else None))
        pod.schedule()
        pod.run()
        pod.log(f"hello from {pod.role} {pod.index}")
        if pod.index == 1:
            time.sleep(0.2)
            pod.log("bad label 7 in shard 3")
            pod.fail(exit_code=3)
            return
        pod.wait_deleted(60)

    kube = start(script)
    spec = WorkerSpec(command=["python", "-m", "tasks", "train"], cluster={"worker": 2},
                      strategy="multi_worker_mirrored", step="train", accelerated=True)
    backend = KubernetesBackend(poll_seconds=0.05, grace_seconds=5)
    with pytest.raises(WorkerError, match="worker:1 .* failed"):
        backend.controller(cfg, ctx, spec, log=lambda line: None, secrets={}).run()
    for plural in ("jobs", "pods", "services", "secrets"):
        assert kube.names(plural, selector=render.run_selector(ctx)) == [], plural
    assert read(log_uri(ctx.run_uri, "train", "worker", 1)) == (
        "hello from worker 1\nbad label 7 in shard 3\n")
    assert read(log_uri(ctx.run_uri, "train", "worker", 0)) == "hello from worker 0\n"
    # Both files were in the bucket before their pods went.
    assert at_delete == {0: "hello from worker 0\n",
                         1: "hello from worker 1\nbad label 7 in shard 3\n"}


def test_release_keeps_the_logs_of_pods_a_dead_controller_left(gs_run):
    cfg, ctx, start = gs_run

    def serve(pod: FakePod) -> None:
        pod.schedule()
        pod.run()
        pod.log(f"serving as {pod.role} {pod.index}", "still serving")
        pod.wait_deleted(60)

    kube = start(serve)
    # The objects a controller made before it died (no teardown ran).
    for obj in render.render_objects(cfg, ctx, single_process_spec("tokenize", ctx.run_uri)):
        kube._create({"Service": "services", "Job": "jobs", "Secret": "secrets"}[obj["kind"]],
                     "default", obj)
    assert kube.wait_for(lambda: any(kube.logs.get(p) for p in kube.pods), timeout=10)
    released = KubernetesBackend().release(cfg, ctx, log=lambda line: None)
    uri = log_uri(ctx.run_uri, "tokenize", "worker", 0)
    assert released["kept_logs"] == [uri]
    assert read(uri) == "serving as worker 0\nstill serving\n"
    assert kube.names("pods", selector=render.run_selector(ctx)) == []


# --- Vertex AI: the worker-side writer --------------------------------------------------------
def _vertex_run(tmp_path):
    cfg = parse_config({**VERTEX, "artifact_root": str(tmp_path / "art"), "num_workers": 2})
    ctx = RunContext(cfg.artifact_root, "bert_finetune", "manual__vertex")
    init_run(cfg, ctx)
    return cfg, ctx


def _vertex_job(cfg, ctx, code: str) -> dict:
    spec = WorkerSpec(command=["python", "-c", code], cluster={"worker": 2},
                      strategy="multi_worker_mirrored", step="train", accelerated=True)
    [job] = backend_for(cfg).render(cfg, ctx, spec)
    return job


def test_vertex_replicas_keep_their_own_logs(tmp_path):
    cfg, ctx = _vertex_run(tmp_path)
    # The worker ends after the chief, as a busy machine may have it: the chief's success
    # must not stop a replica that is still running the program.
    code = ("import json, os, time; t = json.loads(os.environ['TF_CONFIG'])['task']; "
            "time.sleep(t['type'] == 'worker'); print('replica', t['type'], t['index']); "
            "print('done')")
    lines: list[str] = []
    VertexReplicas(_vertex_job(cfg, ctx, code), lines.append).run()
    # Vertex AI's roles: pool 0 is the chief, pool 1 the workers.
    assert read(log_uri(ctx.run_uri, "train", "chief", 0)) == "replica chief 0\ndone\n"
    assert read(log_uri(ctx.run_uri, "train", "worker", 0)) == "replica worker 0\ndone\n"
    # The output still reaches the container's stdout (Cloud Logging on Vertex AI).
    assert "[chief:0] replica chief 0" in lines


def test_a_stopped_vertex_replica_keeps_its_log(tmp_path):
    cfg, ctx = _vertex_run(tmp_path)
    code = "import time; print('step 1 of 100', flush=True); time.sleep(60)"
    lines: list[str] = []
    replicas = VertexReplicas(_vertex_job(cfg, ctx, code), lines.append, grace_seconds=20)
    thread = threading.Thread(target=lambda: pytest.raises(WorkerError, replicas.run))
    thread.start()
    deadline = time.monotonic() + 90
    while sum("step 1 of 100" in ln for ln in lines) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum("step 1 of 100" in ln for ln in lines) == 2, lines
    replicas.stop()  # SIGTERM to each replica, as Vertex AI sends when it cancels a job
    thread.join(30)
    assert not thread.is_alive(), lines
    for role in ("chief", "worker"):
        text = read(log_uri(ctx.run_uri, "train", role, 0))
        assert text.startswith("step 1 of 100\n") and "received signal 15" in text, text


def test_worker_side_writer_returns_the_exit_code_and_names_the_replica(tmp_path):
    cfg, ctx = _vertex_run(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT),
           "CLUSTER_SPEC": json.dumps({"task": {"type": "workerpool2", "index": 1}})}
    done = subprocess.run(
        [sys.executable, "-m", "tasks.provision.worker_logs", "--run-dir", ctx.run_uri,
         "--step", "evaluate", "--", "python", "-c", "import sys; print('ps up'); sys.exit(4)"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 4 and done.stdout == "ps up\n"
    assert read(log_uri(ctx.run_uri, "evaluate", "ps", 1)) == "ps up\n"
    assert worker_identity({}) == ("worker", 0)
    # Inside a provisioning attempt the replica keeps that attempt's own file too.
    done = subprocess.run(
        [sys.executable, "-m", "tasks.provision.worker_logs", "--run-dir", ctx.run_uri,
         "--step", "evaluate", "--", "python", "-c", "print('attempt 2')"],
        cwd=PROJECT_ROOT, env={**env, attempts.ATTEMPT_ENV: "2"}, capture_output=True,
        text=True, timeout=60)
    assert done.returncode == 0
    assert read(log_uri(ctx.run_uri, "evaluate", "ps", 1, 2)) == "attempt 2\n"
    assert read(log_uri(ctx.run_uri, "evaluate", "ps", 1)) == "attempt 2\n"


def test_a_replica_restarted_in_place_keeps_the_earlier_runs_log(tmp_path):
    """Vertex AI restarts a replica that exits non-zero in place, with the same environment
    (so the same attempt): the restart's writer continues the attempt's file."""
    cfg, ctx = _vertex_run(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), attempts.ATTEMPT_ENV: "1",
           "CLUSTER_SPEC": json.dumps({"task": {"type": "workerpool0", "index": 0}})}
    for code in ("import sys; print('first run, step 7'); sys.exit(1)",
                 "print('restarted, done')"):
        subprocess.run(
            [sys.executable, "-m", "tasks.provision.worker_logs", "--run-dir", ctx.run_uri,
             "--step", "train", "--", "python", "-c", code],
            cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60)
    from tasks.provision.worker_logs import RESTARTED

    kept = f"first run, step 7\n{RESTARTED}\nrestarted, done\n"
    assert read(log_uri(ctx.run_uri, "train", "chief", 0, 1)) == kept
    assert read(log_uri(ctx.run_uri, "train", "chief", 0)) == kept


def test_uploads_never_land_out_of_order(tmp_path, monkeypatch):
    """A slow periodic upload of an older copy must not overwrite the final one: uploads run
    one at a time, each of the newest text."""
    from tasks.provision import worker_logs

    uri = str(tmp_path / "train" / "logs" / "worker-0.log")
    spool = worker_logs.Spool(uri)
    real_upload = storage.upload_file
    first = threading.Event()

    def slow_upload(path, dest):
        if not first.is_set():  # the periodic flush: it copied "line 1" only
            first.set()
            time.sleep(0.5)
        real_upload(path, dest)

    monkeypatch.setattr(storage, "upload_file", slow_upload)
    spool.line("line 1")
    periodic = threading.Thread(target=spool.flush)
    periodic.start()
    first.wait(5)
    spool.line("line 2")
    spool.flush(force=True)  # the final flush, while the older upload is still running
    periodic.join(5)
    spool.close()
    assert read(uri) == "line 1\nline 2\n"


def test_sigterm_amid_a_flood_of_output_is_passed_on_and_the_log_kept(tmp_path):
    """SIGTERM while the worker floods its output (the handler may interrupt the writer's own
    write to the log, so it takes no lock): passed to the worker, the writer exits with
    128 + 15 and the log ends with what happened."""
    import signal as signals

    cfg, ctx = _vertex_run(tmp_path)
    flood = "import itertools\nfor i in itertools.count(): print('line', i, flush=True)"
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tasks.provision.worker_logs", "--run-dir", ctx.run_uri,
             "--step", "train", "--", "python", "-c", flood], cwd=PROJECT_ROOT,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL)
        assert proc.stdout.readline().startswith(b"line ")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep it flowing
        time.sleep(0.3)
        proc.send_signal(signals.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 128 + signals.SIGTERM
        finally:
            proc.kill()
        text = read(log_uri(ctx.run_uri, "train", "worker", 0))
        assert text.startswith("line 0\n") and text.rstrip().endswith(
            "[bertflow] received signal 15; passed to the worker, which exited with code -15")
