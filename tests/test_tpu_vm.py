"""provisioner tpu_vm: the real google-cloud-tpu client against a fake Cloud TPU API on
loopback (tests/fake_tpu.py), and the VM's agent as a real process against a run folder on the
GCS emulator (tests/storage_servers.py). No TensorFlow: the agent runs any command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from fake_tpu import FakeTpu
from storage_servers import BUCKET, gcs_emulator  # noqa: F401
from tasks.io import storage
from tasks.config import PROJECT_ROOT, parse_config
from tasks.errors import BertflowError, ConfigError, WorkerError
from tasks.provision import attempts, worker_logs
from tasks.provision.backends import backend_for
from tasks.provision.tpu_vm import backend as tpu_vm
from tasks.provision.tpu_vm import client as tpu_client
from tasks.provision.tpu_vm import render as tpu_render
from tasks.provision.spec import WorkerSpec
from tasks.runs.runlayout import RunContext
from test_cli import cli

ZONE, PROJECT = "us-west4-a", "bertflow-test"
SECRET = "bertflow-tpu-secret-5d2e8c71aa"  # a connection's key: must never be written anywhere
CONN_ID = "bertflow_gcs"
SECRETS = {f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(
    {"conn_type": "google_cloud_platform", "password": SECRET,
     "extra": {"keyfile_dict": {"private_key": SECRET}}})}


def tpu_config(root: str, **overrides):
    values = {"provisioner": "tpu_vm", "accelerator": "tpu", "tpu_address": "local",
              "tpu_zone": ZONE, "tpu_project": PROJECT, "accelerator_type": "v5litepod-8",
              "image_registry": "us-docker.pkg.dev/bertflow-test/trainers",
              "service_account": "trainer@bertflow-test.iam.gserviceaccount.com",
              "network": "ml-net", "gcp_conn_id": CONN_ID, "artifact_root": root,
              "schedule_timeout_seconds": 60, **overrides}
    return parse_config(values)


def run_context(root: str, key: str = "manual__tpu") -> RunContext:
    return RunContext(root, "bert_finetune", key, key)


@pytest.fixture
def fake_tpu(monkeypatch):
    fake = FakeTpu().start()
    monkeypatch.setenv(tpu_client.ENDPOINT_ENV, fake.endpoint)
    monkeypatch.setattr(tpu_vm.TpuVmBackend, "poll_seconds", 0.01)
    yield fake
    fake.stop()


@pytest.fixture
def gs_root(gcs_emulator):  # noqa: F811
    return f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text


# --- setup ----------------------------------------------------------------------------------
@pytest.mark.parametrize("accelerator_type, address, runtime", [
    ("v5litepod-8", "local", "v2-alpha-tpuv5-lite"),
    # A multi-host slice: the TensorFlow pod runtime, set explicitly (none is documented for
    # TensorFlow 2.20).
    ("v5litepod-16", "bertflow-pod", "tpu-vm-tf-2.20.0-pod-pjrt"),
])
def test_setup_queues_the_tpu_and_waits_until_active(fake_tpu, accelerator_type, address,
                                                     runtime):
    root = f"gs://{BUCKET}/root"
    explicit = {"tpu_runtime_version": runtime} if address != "local" else {}
    cfg, ctx = tpu_config(root, accelerator_type=accelerator_type, tpu_address=address,
                          **explicit), run_context(root)
    lines = []
    before = time.time()
    facts = tpu_vm.TpuVmBackend().setup(cfg, ctx, log=lines.append)

    rid = address if address != "local" else f"bertflow-{tpu_render.run_hash(ctx)}"
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    create = fake_tpu.requests[fake_tpu.calls().index(("POST", f"{parent}/queuedResources"))]
    assert create["query"]["queuedResourceId"] == rid
    spec = create["body"]["tpu"]["nodeSpec"][0]
    node = spec["node"]
    assert (spec["parent"], spec["nodeId"]) == (parent, rid)
    assert (node["acceleratorType"], node["runtimeVersion"]) == (accelerator_type, runtime)
    assert node["serviceAccount"]["email"] == cfg.service_account
    assert node["networkConfig"] == {"network": "ml-net", "enableExternalIps": True}
    labels = node["labels"]
    assert labels["managed-by"] == "bertflow" and labels["bertflow-dag"] == "bert_finetune"
    assert labels["bertflow-run"] == tpu_render.run_hash(ctx)
    # Expiry: queue patience + worker lifetime from now.
    assert int(labels["bertflow-expires"]) >= int(before) + 60 + cfg.worker_timeout_minutes * 60
    assert create["body"]["queueingPolicy"]["validUntilDuration"] == "60s"
    script = node["metadata"]["startup-script"]
    assert "agent-worker-number" in script  # only host 0 runs the agent
    assert f"tasks.provision.tpu_vm.agent --run-dir {ctx.run_uri}" in script
    assert "us-docker.pkg.dev/bertflow-test/trainers/bertflow-trainer-tpu:" in script
    # It waited through the queue's states and found the node.
    assert [ln.split(": ")[-1] for ln in lines if ln.startswith(f"[tpu] {rid}: ")] == [
        "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    assert facts["node"] == f"{parent}/nodes/{rid}"
    assert facts["runtime_version"] == runtime and facts["tpu_address"] == address
    _no_secret(json.dumps(fake_tpu.requests), json.dumps(facts), "\n".join(lines))


def test_a_retried_setup_waits_for_the_queued_resource_it_made(fake_tpu):
    root = f"gs://{BUCKET}/root"
    cfg, ctx = tpu_config(root), run_context(root)
    fake_tpu.states = ["WAITING_FOR_RESOURCES"]
    with pytest.raises(BertflowError):
        tpu_vm.TpuVmBackend().setup(cfg.model_copy(update={"schedule_timeout_seconds": 0.2}),
                                    ctx, log=lambda _: None)
    fake_tpu.scripts[next(iter(fake_tpu.queued))] = ["PROVISIONING", "ACTIVE"]
    tpu_vm.TpuVmBackend().setup(cfg, ctx, log=lambda _: None)
    assert len(fake_tpu.calls("POST")) == 1  # queued once, its place in the queue kept


def test_stock_out_times_out_naming_what_to_change(fake_tpu):
    root = f"gs://{BUCKET}/root"
    cfg = tpu_config(root).model_copy(update={"schedule_timeout_seconds": 0.3})
    fake_tpu.states = ["WAITING_FOR_RESOURCES"]
    started = time.monotonic()
    with pytest.raises(BertflowError) as err:
        tpu_vm.TpuVmBackend().setup(cfg, run_context(root), log=lambda _: None)
    assert time.monotonic() - started < 5
    message = str(err.value)
    assert "stayed WAITING_FOR_RESOURCES" in message
    for needle in ("v5litepod-8", ZONE, "tpu_zone", "accelerator_type", "reservation",
                   "schedule_timeout_seconds"):
        assert needle in message


def test_quota_failure_reports_the_platform_message(fake_tpu):
    root = f"gs://{BUCKET}/root"
    fake_tpu.states = ["WAITING_FOR_RESOURCES", "FAILED"]
    with pytest.raises(BertflowError) as err:
        tpu_vm.TpuVmBackend().setup(tpu_config(root), run_context(root), log=lambda _: None)
    message = str(err.value)
    assert fake_tpu.failure in message
    assert "quota" in message and "v5litepod-8" in message and ZONE in message


# --- teardown and sweep -------------------------------------------------------------------------
def test_release_deletes_the_node_then_the_queued_resource(fake_tpu, gs_root):
    cfg, ctx = tpu_config(gs_root), run_context(gs_root)
    backend = tpu_vm.TpuVmBackend()
    backend.setup(cfg, ctx, log=lambda _: None)
    released = backend.release(cfg, ctx, log=lambda _: None)

    parent = f"projects/{PROJECT}/locations/{ZONE}"
    rid = f"bertflow-{tpu_render.run_hash(ctx)}"
    deletes = fake_tpu.calls("DELETE")
    assert deletes == [("DELETE", f"{parent}/nodes/{rid}"),
                       ("DELETE", f"{parent}/queuedResources/{rid}")]
    assert fake_tpu.requests[-1]["query"].get("force") == "true"
    assert released["deleted"] == [f"{parent}/nodes/{rid}", f"{parent}/queuedResources/{rid}"]
    assert not fake_tpu.queued and not fake_tpu.nodes
    assert storage.exists(tpu_render.agent_uri(ctx, "shutdown.json"))  # the agent's signal

    again = backend.release(cfg, ctx, log=lambda _: None)  # already gone: no error
    assert again["deleted"] == [] and len(again["already_gone"]) == 2


def test_release_keeps_the_log_of_a_step_the_agent_never_finished(fake_tpu, gs_root,
                                                                 monkeypatch):
    """The VM's agent died mid-step (no status): release writes the step's log from the
    chunks the agent had uploaded, before the VM is deleted."""
    cfg, ctx = tpu_config(gs_root), run_context(gs_root)
    monkeypatch.setattr(tpu_vm.TpuVmBackend, "release_wait_seconds", 0.5)
    storage.write_json(tpu_render.agent_uri(ctx, "requests", "train.json"),
                       tpu_render.step_request(cfg, _spec("train", "x"), "train-002"))
    storage.write_text(tpu_render.agent_uri(ctx, "logs", "train-002", "000001.txt"), "epoch 1\n")
    storage.write_text(tpu_render.agent_uri(ctx, "logs", "train-002", "000002.txt"), "epoch 2\n")
    released = tpu_vm.TpuVmBackend().release(cfg, ctx, log=lambda _: None)
    uri = worker_logs.log_uri(ctx.run_uri, "train", "worker", 0)
    assert released["kept_logs"] == [uri]
    assert storage.read_text(uri) == "epoch 1\nepoch 2\n"
    assert storage.exists(tpu_render.agent_uri(ctx, "cancel", "train-002.json"))


def test_sweep_deletes_expired_bertflow_resources_only(fake_tpu):
    parent = f"projects/{PROJECT}/locations/{ZONE}"

    def resource(rid: str, labels: dict) -> dict:
        return {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": rid, "node": {
            "acceleratorType": "v5litepod-8", "labels": labels}}]}}

    now = int(time.time())
    fake_tpu.add_queued(f"{parent}/queuedResources/old", resource(
        "old", {"managed-by": "bertflow", "bertflow-expires": str(now - 60)}), "ACTIVE")
    fake_tpu.add_queued(f"{parent}/queuedResources/fresh", resource(
        "fresh", {"managed-by": "bertflow", "bertflow-expires": str(now + 3600)}), "ACTIVE")
    fake_tpu.add_queued(f"{parent}/queuedResources/theirs", resource(
        "theirs", {"bertflow-expires": str(now - 60)}), "ACTIVE")
    cfg = parse_config({"provisioner": "tpu_vm", "tpu_zone": ZONE, "tpu_project": PROJECT})

    removed = backend_for(cfg).sweep(cfg, log=lambda _: None)
    assert removed == [f"{parent}/queuedResources/old"]
    assert fake_tpu.calls("DELETE") == [("DELETE", f"{parent}/nodes/old"),
                                        ("DELETE", f"{parent}/queuedResources/old")]
    assert sorted(fake_tpu.queued) == [f"{parent}/queuedResources/fresh",
                                       f"{parent}/queuedResources/theirs"]


# --- checks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, field", [
    ({"artifact_root": "/srv/artifacts"}, "artifact_root"),
    ({"artifact_root": "s3://bucket/root"}, "artifact_root"),
    ({"accelerator": "auto"}, "accelerator"),
    ({"tpu_zone": ""}, "tpu_zone"),
    ({"accelerator_type": ""}, "accelerator_type"),
    ({"accelerator_type": "tpu-v5-lite-podslice"}, "accelerator_type"),
    ({"tpu_address": "grpc://10.0.0.2:8470"}, "tpu_address"),
    ({"accelerator_type": "v4-32", "tpu_address": "local"}, "tpu_address"),
    ({"accelerator_type": "v4-32", "tpu_address": "pod-a",
      "tpu_runtime_version": "tpu-vm-tf-2.20.0-pjrt"}, "tpu_runtime_version"),
    # No Google page lists a TensorFlow 2.20 pod runtime: a multi-host slice names its own.
    ({"accelerator_type": "v4-32", "tpu_address": "pod-a"}, "tpu_runtime_version"),
    ({"accelerator_type": "v4-32", "tpu_address": "pod-a",
      "tpu_runtime_version": "tpu-ubuntu2204-base"}, "tpu_runtime_version"),
    ({"accelerator_type": "v9x-8"}, "tpu_runtime_version"),
    ({"image_registry": ""}, "image_registry"),
    # A multi-host slice's runtime serves the image's TensorFlow (2.20): they must match.
    ({"accelerator_type": "v4-32", "tpu_address": "pod-a",
      "tpu_runtime_version": "tpu-vm-tf-2.18.0-pod-pjrt"}, "tpu_runtime_version"),
    ({"accelerator_type": "v5litepod-16", "tpu_address": "pod-a",
      "tpu_runtime_version": "v2-alpha-tpuv5-lite-pod"}, "tpu_runtime_version"),
])
def test_check_names_the_field_to_change(overrides, field):
    cfg = tpu_config("gs://b/root", **overrides)
    with pytest.raises(ConfigError) as err:
        tpu_vm.TpuVmBackend().check(cfg, run_context(cfg.artifact_root))
    assert err.value.field == field


def test_check_accepts_a_single_host_and_a_named_multi_host_slice():
    backend = tpu_vm.TpuVmBackend()
    assert backend.check(tpu_config("gs://b/root"), run_context("gs://b/root")) == []
    pod = tpu_config("gs://b/root", accelerator_type="v4-32", tpu_address="pod-a",
                     tpu_runtime_version="tpu-vm-tf-2.20.0-pod-pjrt")
    assert backend.check(pod, run_context("gs://b/root")) == []
    # A custom image's TensorFlow is the user's to match.
    custom = tpu_config("gs://b/root", accelerator_type="v4-32", tpu_address="pod-a",
                        tpu_runtime_version="tpu-vm-tf-2.18.0-pod-pjrt",
                        worker_image="us-docker.pkg.dev/p/r/tf218-tpu:1")
    assert backend.check(custom, run_context("gs://b/root")) == []


def test_a_pod_runtime_of_other_tensorflow_names_both_versions_and_what_to_set():
    cfg = tpu_config("gs://b/root", accelerator_type="v4-32", tpu_address="pod-a",
                     tpu_runtime_version="tpu-vm-tf-2.18.0-pod-pjrt")
    with pytest.raises(ConfigError) as err:
        tpu_vm.TpuVmBackend().check(cfg, run_context(cfg.artifact_root))
    text = str(err.value)
    assert "runs TensorFlow 2.18" in text and f"TensorFlow {tpu_render.TF_VERSION}" in text
    assert tpu_render.POD_RUNTIME_EXAMPLE in text and "worker_image" in text


@pytest.mark.parametrize("accelerator_type, runtime", [
    ("v4-8", "tpu-ubuntu2204-base"), ("v3-8", "tpu-ubuntu2204-base"),
    ("v5litepod-8", "v2-alpha-tpuv5-lite"), ("v5litepod-4", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e"), ("v6e-1", "v2-alpha-tpuv6e"),
])
def test_default_runtime_is_the_documented_base_runtime_of_the_generation(accelerator_type,
                                                                          runtime):
    cfg = tpu_config("gs://b/root", accelerator_type=accelerator_type)
    assert tpu_render.runtime_version(cfg) == runtime
    assert tpu_vm.TpuVmBackend().check(cfg, run_context("gs://b/root")) == []
    # An explicit runtime wins.
    cfg = tpu_config("gs://b/root", accelerator_type=accelerator_type,
                     tpu_runtime_version="tpu-vm-tf-2.18.0-pjrt")
    assert tpu_render.runtime_version(cfg) == "tpu-vm-tf-2.18.0-pjrt"


def test_external_ips_are_a_choice_of_the_config():
    """Organisations that forbid external IPs turn them off (Private Google Access)."""
    root = "gs://b/root"
    for value in (True, False):
        cfg = tpu_config(root, tpu_external_ips=value)
        node = tpu_render.to_dict(tpu_render.queued_resource(cfg, run_context(root), PROJECT))[
            "tpu"]["nodeSpec"][0]["node"]
        assert node["networkConfig"].get("enableExternalIps", False) is value
    assert tpu_config(root).tpu_external_ips is True  # gcloud's default


def test_pod_slice_steps_load_no_local_libtpu_and_single_hosts_keep_the_image_pjrt():
    spec = WorkerSpec(command=["python", "-m", "tasks", "train"], env={"A": "1"}, cluster={},
                      strategy="tpu", step="train", accelerated=True)
    single = tpu_render.step_request(tpu_config("gs://b/root"), spec, "train-001")["env"]
    assert "TPU_LOAD_LIBRARY" not in single and "TF_PLUGGABLE_DEVICE_LIBRARY_PATH" not in single
    pod = tpu_render.step_request(tpu_config("gs://b/root", accelerator_type="v4-32",
                                         tpu_address="pod-a",
                                         tpu_runtime_version="tpu-vm-tf-2.18.0-pod-pjrt"),
                              spec, "train-001")["env"]
    assert pod["TPU_LOAD_LIBRARY"] == "0" and pod["A"] == "1"
    # The image's PJRT plug-in is switched off: tensorflow-tpu loads it only when non-empty.
    assert pod["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == ""
    assert pod["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "false"


def test_dry_run_prints_the_queued_resource_and_warns_about_a_local_folder(artifact_root):
    run_dir = f"{artifact_root}/runs/bert_finetune/manual_tpu"
    done = cli("init-run", "--run-dir", run_dir, "--provisioner", "tpu_vm",
               "--accelerator", "tpu", "--tpu_address", "local", "--tpu_zone", ZONE,
               "--tpu_project", PROJECT, "--accelerator_type", "v5litepod-8",
               "--image_registry", "us-docker.pkg.dev/bertflow-test/trainers",
               "--gcp_conn_id", CONN_ID)
    assert done.returncode == 0, done.stderr
    done = cli("provision", "--dry-run", "--run-dir", run_dir)
    assert done.returncode == 0, done.stderr
    objects = json.loads(done.stdout)
    kinds = [o.get("kind", o.get("runs_on")) for o in objects]
    assert kinds.count("tpu.googleapis.com/QueuedResource") == 1
    assert [o["request"]["step"] for o in objects if o.get("kind") == "bertflow/TpuStepRequest"
            ] == ["train", "evaluate"]
    queued = next(o for o in objects if o.get("kind") == "tpu.googleapis.com/QueuedResource")
    node = queued["queuedResource"]["tpu"]["nodeSpec"][0]["node"]
    assert node["runtimeVersion"] == "v2-alpha-tpuv5-lite"
    assert "tpu_vm.agent" in node["metadata"]["startup-script"]
    # data, tokenize and export run on the Airflow worker (before the VM exists / after
    # release).
    assert [o["command"][3] for o in objects if "runs_on" in o] == ["data", "tokenize",
                                                                    "export"]
    assert "warning: artifact_root" in done.stderr and "local path" in done.stderr
    assert not (PROJECT_ROOT / run_dir / "provision").exists()

    real = cli("provision", "--run-dir", run_dir)
    assert real.returncode == 2
    assert "config field 'artifact_root'" in real.stderr


# --- the agent and the controller, end to end ----------------------------------------------------
def _start_agent(ctx: RunContext) -> subprocess.Popen:
    """The VM's agent as a real process, polling a run folder on the GCS emulator."""
    return subprocess.Popen(
        [sys.executable, "-m", "tasks.provision.tpu_vm.agent", "--run-dir", ctx.run_uri,
         "--poll-seconds", "0.2", "--flush-seconds", "0.2", "--heartbeat-seconds", "0.5"],
        cwd=PROJECT_ROOT, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def agent(gs_root):
    ctx = run_context(gs_root)
    process = _start_agent(ctx)
    yield ctx, process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def _spec(step: str, code: str) -> WorkerSpec:
    return WorkerSpec(command=["python", "-c", code], step=step, accelerated=True)


def _controller(cfg, ctx, spec, log):
    controller = backend_for(cfg).controller(cfg, ctx, spec, log=log, secrets=SECRETS)
    controller.poll_seconds = 0.1
    return controller


def _eventually(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_agent_runs_steps_streams_logs_and_obeys_cancel(agent, fake_tpu):
    ctx, process = agent
    cfg = tpu_config(ctx.artifact_root)
    log: list[str] = []

    # Success: lines streamed with the prefix, in order; the step sees a keyless connection.
    ok = _spec("train", "import os; print('step one'); print('step two'); "
                        f"print('conn', os.environ['AIRFLOW_CONN_{CONN_ID.upper()}'])")
    _controller(cfg, ctx, ok, log.append).run()
    streamed = [ln for ln in log if ln.startswith("[tpu:0] ")]
    assert streamed[:2] == ["[tpu:0] step one", "[tpu:0] step two"]
    assert json.loads(streamed[2].split("conn ", 1)[1])["conn_type"] == "google_cloud_platform"
    # The agent kept the step's whole log in the run folder before its status.
    train_log = worker_logs.log_uri(ctx.run_uri, "train", "worker", 0)
    assert storage.read_text(train_log).startswith("step one\nstep two\nconn ")

    # Failure: the worker's exit code and last lines.
    bad = _spec("evaluate", "import sys; print('loading'); print('bad label 7'); sys.exit(3)")
    with pytest.raises(WorkerError) as err:
        _controller(cfg, ctx, bad, log.append).run()
    assert "tpu:0 exited with code 3: bad label 7" in str(err.value)
    assert "loading" in str(err.value)
    assert storage.read_text(worker_logs.log_uri(ctx.run_uri, "evaluate", "worker", 0)) == \
        "loading\nbad label 7\n"

    # A retried task while its step still runs on the VM follows it instead of running twice.
    slow = _spec("evaluate", "import time; print('slow start', flush=True); time.sleep(1.5); "
                           "print('slow end')")
    first_log: list[str] = []
    first = _controller(cfg, ctx, slow, first_log.append)
    thread = threading.Thread(target=first.run)
    thread.start()
    assert _eventually(lambda: "[tpu:0] slow start" in first_log)
    retry_log: list[str] = []
    retry = _controller(cfg, ctx, slow, retry_log.append)
    retry.run()
    thread.join(timeout=20)
    assert retry.request_id == first.request_id == "evaluate-002"
    assert retry_log.count("[tpu:0] slow start") == 1 and "[tpu:0] slow end" in retry_log
    assert not storage.exists(tpu_render.agent_uri(ctx, "logs", "evaluate-003"))
    # Once finished, the same step asked again runs again, under the next id.
    again = _controller(cfg, ctx, _spec("evaluate", "print('again')"), log.append)
    again.run()
    assert again.request_id == "evaluate-003"

    # stop() (Airflow's on_kill) cancels the running step on the VM.
    hang = _spec("train", "import os, time; print('pid', os.getpid(), flush=True); "
                          "time.sleep(120)")
    hang_log: list[str] = []
    controller = _controller(cfg, ctx, hang, hang_log.append)
    failure: list[Exception] = []
    thread = threading.Thread(target=lambda: _catch(controller.run, failure))
    thread.start()
    assert _eventually(lambda: any(ln.startswith("[tpu:0] pid ") for ln in hang_log))
    pid = int(next(ln for ln in hang_log if ln.startswith("[tpu:0] pid ")).split()[-1])
    controller.stop()
    thread.join(timeout=10)
    assert failure and isinstance(failure[0], WorkerError) and "stopped" in str(failure[0])
    status_uri = tpu_render.agent_uri(ctx, "status", f"{controller.request_id}.json")
    assert _eventually(lambda: storage.exists(status_uri))
    status = storage.read_json(status_uri)
    assert status["cancelled"] is True and status["exit_code"] != 0
    assert not _alive(pid)
    assert storage.read_text(train_log) == f"pid {pid}\n"  # the stopped attempt's log

    # Release tells the agent to exit; nothing was created on the (fake) TPU API.
    backend_for(cfg).release(cfg, ctx, log=lambda _: None)
    assert process.wait(timeout=20) == 0

    # No secret in anything written, sent or logged.
    written = [storage.read_bytes(u).decode() for u in storage.list_uris(ctx.run_uri + "/")]
    rendered = [json.dumps(backend_for(cfg).render(cfg, ctx, spec)) for spec in (ok, bad)]
    _no_secret(*written, *rendered, "\n".join(log + first_log + retry_log + hang_log),
               json.dumps(fake_tpu.requests), process.stdout.read())


def test_controller_fails_when_no_agent_picks_the_step_up(gs_root, fake_tpu):
    cfg, ctx = tpu_config(gs_root), run_context(gs_root)
    controller = _controller(cfg, ctx, _spec("train", "print(1)"), lambda _: None)
    controller.pickup_seconds = 0.5
    with pytest.raises(WorkerError, match="did not pick up train-001.*TPU API says: queued "
                                          "resource gone.*google-startup-scripts"):
        controller.run()


def _catch(fn, errors: list) -> None:
    try:
        fn()
    except Exception as err:  # noqa: BLE001
        errors.append(err)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_step_exiting_75_on_the_vm_runs_again_on_the_same_vm(agent, fake_tpu):
    """A maintenance event on a live TPU VM: the step (a stand-in that exits 75, the
    contract's "preempted, saved" code, on its first attempt) is run again by the attempt loop
    on the same VM, within one Airflow try; attempts.json records both attempts."""
    ctx, _ = agent
    cfg = tpu_config(ctx.artifact_root)
    code = ("import os, sys; n = os.environ['BERTFLOW_ATTEMPT']; print('attempt', n); "
            "sys.exit(75 if n == '1' else 0)")
    log: list[str] = []
    loop = attempts.AttemptLoop(lambda spec: _controller(cfg, ctx, spec, log.append), cfg,
                                ctx, _spec("train", code), log.append)
    loop.run()
    assert "[tpu:0] attempt 1" in log and "[tpu:0] attempt 2" in log
    records = attempts.read_attempts(ctx, "train")
    assert [r["outcome"] for r in records] == ["preempted", "success"]
    assert all(r["running_at"] is not None for r in records)


def test_a_running_step_keeps_the_tpu_expiry_ahead_and_the_sweep_reads_it(agent, fake_tpu,
                                                                        monkeypatch):
    """The expiry set at creation covers one step's lifetime; a longer run must not be swept
    while a step runs: the controller renews the node's label, and the sweep reads the node's
    label rather than the queued resource's copy."""
    ctx, _ = agent
    cfg = tpu_config(ctx.artifact_root)
    backend = tpu_vm.TpuVmBackend()
    backend.setup(cfg, ctx, log=lambda _: None)
    queued, node = tpu_render.tpu_names(cfg, ctx, PROJECT)
    # As if created long ago: the label passed a minute ago.
    past = str(int(time.time()) - 60)
    fake_tpu.nodes[node]["labels"]["bertflow-expires"] = past
    fake_tpu.queued[queued]["tpu"]["nodeSpec"][0]["node"]["labels"]["bertflow-expires"] = past
    monkeypatch.setattr(tpu_vm.TpuStepController, "renew_seconds", 0.3)
    log: list[str] = []
    before = time.time()
    _controller(cfg, ctx, _spec("train", "import time; time.sleep(2); print('done')"),
                log.append).run()
    assert any(ln.startswith("[tpu] expiry label renewed to ") for ln in log), log
    labels = fake_tpu.nodes[node]["labels"]
    assert int(labels["bertflow-expires"]) >= int(before) + cfg.worker_timeout_minutes * 60
    assert labels["bertflow-run"] == tpu_render.run_hash(ctx)  # the other labels kept
    patches = [r for r in fake_tpu.requests if r["method"] == "PATCH"]
    assert patches and all(r["query"]["updateMask"] == "labels" for r in patches)
    # The queued resource still carries the old expiry; the sweep goes by the node's.
    assert backend.sweep(cfg, log=lambda _: None) == []
    assert queued in fake_tpu.queued
    fake_tpu.nodes[node]["labels"]["bertflow-expires"] = past  # the step ended long ago
    assert backend.sweep(cfg, log=lambda _: None) == [queued]


# --- a spot TPU taken back by the platform ---------------------------------------------------
class TpuVms:
    """Plays each node's startup script: the agent starts as the fake's node appears, and it
    and its step are SIGKILLed as the node is preempted or deleted (no notice)."""

    def __init__(self, fake: FakeTpu, ctx: RunContext):
        self.ctx, self.booted, self.running = ctx, [], {}
        fake.on_boot, fake.on_halt = self.boot, self.halt

    def boot(self, node: str) -> None:
        self.booted.append(node)
        self.running[node] = _start_agent(self.ctx)

    def halt(self, node: str) -> None:
        process = self.running.pop(node, None)
        if process is None:
            return
        import psutil

        for child in psutil.Process(process.pid).children(recursive=True):  # the step
            child.kill()
        process.kill()
        process.wait(timeout=10)
        process.stdout.close()

    def close(self) -> None:
        for node in list(self.running):
            self.halt(node)


@pytest.fixture
def spot_tpu(fake_tpu, gs_root):
    """A spot run whose TPU setup queued and the fake made ACTIVE, its agent running."""
    cfg, ctx = tpu_config(gs_root, capacity="spot"), run_context(gs_root)
    vms = TpuVms(fake_tpu, ctx)
    tpu_vm.TpuVmBackend().setup(cfg, ctx, log=lambda _: None)
    yield cfg, ctx, vms
    vms.close()


# A stand-in for train: the first attempt saves "step 2" to its checkpoint (a local file
# here) and runs on until the VM goes; a later one resumes from the checkpoint and finishes.
TRAIN = """
import os, sys, time
checkpoint = sys.argv[1]
start = int(open(checkpoint).read()) if os.path.exists(checkpoint) else 0
print('attempt', os.environ['BERTFLOW_ATTEMPT'], 'resumes at step', start, flush=True)
if start == 0:
    open(checkpoint, 'w').write('2')
    print('saved step 2', flush=True)
    time.sleep(600)
print('finished step 4', flush=True)
"""


def _train_loop(cfg, ctx, checkpoint, log: list[str], spec: WorkerSpec | None = None,
                first_pickup_seconds: float | None = None, stale_seconds: float = 5.0,
                reclaim_check_seconds: float = 3600.0):
    """An attempt loop over the TPU controller; `first_pickup_seconds`: how long attempt 1
    waits for the agent to pick its request up (later ones wait for a new VM). By default a
    reclaim is found through the stale heartbeat (the agent beats every 0.5 s)."""
    spec = spec or WorkerSpec(command=["python", "-c", TRAIN, str(checkpoint)], step="train",
                              accelerated=True)

    def make(attempt_spec: WorkerSpec):
        controller = _controller(cfg, ctx, attempt_spec, log.append)
        controller.stale_seconds = stale_seconds
        controller.reclaim_check_seconds = reclaim_check_seconds
        if attempt_spec.env[attempts.ATTEMPT_ENV] == "1":
            controller.pickup_seconds = first_pickup_seconds
        return controller

    return attempts.AttemptLoop(make, cfg, ctx, spec, log.append)


def _once_saved(log: list[str], disrupt) -> None:
    """`disrupt()` from another thread once the first attempt saved its checkpoint."""
    threading.Thread(target=lambda: _eventually(lambda: "[tpu:0] saved step 2" in log, 60)
                     and disrupt(), daemon=True).start()


def _writes(fake: FakeTpu) -> list[tuple[str, str]]:
    return [call for call in fake.calls() if call[0] != "GET"]


def _spec_without_expiry(request: dict) -> dict:
    """A create request, less the expiry label (from the time of the create)."""
    body = json.loads(json.dumps(request["body"]))
    del body["tpu"]["nodeSpec"][0]["node"]["labels"]["bertflow-expires"]
    return {"query": request["query"], "body": body}


def test_state_names_are_the_clients():
    from google.cloud import tpu_v2

    assert set(tpu_client.SUSPENDED_STATES) <= set(tpu_v2.QueuedResourceState.State.__members__)
    assert set(tpu_client.GONE_NODE_STATES) <= set(tpu_v2.Node.State.__members__)


def test_a_spot_tpu_taken_back_mid_step_is_queued_again_and_the_step_resumes(
        fake_tpu, spot_tpu, tmp_path):
    cfg, ctx, vms = spot_tpu
    queued, node = tpu_render.tpu_names(cfg, ctx, PROJECT)
    log: list[str] = []
    _once_saved(log, lambda: fake_tpu.reclaim(queued))
    _train_loop(cfg, ctx, tmp_path / "checkpoint", log).run()

    records = attempts.read_attempts(ctx, "train")
    assert [r["outcome"] for r in records] == ["lost", "success"], "\n".join(log[-30:])
    assert any("attempt 1 was lost" in ln and
               "queued resource SUSPENDED (by the service), node PREEMPTED" in ln for ln in log)
    assert "[tpu:0] attempt 2 resumes at step 2" in log and "[tpu:0] finished step 4" in log
    # The reclaimed TPU was deleted, node first, and queued again with the same spec; its
    # startup script ran again on the new VM.
    parent = queued.rsplit("/queuedResources/", 1)[0]
    assert _writes(fake_tpu) == [("POST", f"{parent}/queuedResources"), ("DELETE", node),
                                 ("DELETE", queued), ("POST", f"{parent}/queuedResources")]
    first, second = (r for r in fake_tpu.requests if r["method"] == "POST")
    assert _spec_without_expiry(first) == _spec_without_expiry(second)
    assert vms.booted == [node, node]
    # Teardown deletes the new TPU.
    released = tpu_vm.TpuVmBackend().release(cfg, ctx, log=lambda _: None)
    assert released["deleted"] == [node, queued] and not fake_tpu.queued and not fake_tpu.nodes


def test_a_spot_reclaim_is_found_by_asking_the_tpu_api_before_the_heartbeat_goes_stale(
        fake_tpu, spot_tpu, tmp_path):
    """A stale heartbeat takes stale_seconds (10 minutes by default) to tell; on a spot run
    the TPU API's state, asked every reclaim_check_seconds, tells first."""
    cfg, ctx, _ = spot_tpu
    queued, _ = tpu_render.tpu_names(cfg, ctx, PROJECT)
    log: list[str] = []
    _once_saved(log, lambda: fake_tpu.reclaim(queued))
    loop = _train_loop(cfg, ctx, tmp_path / "checkpoint", log, stale_seconds=3600.0,
                       reclaim_check_seconds=1.0)
    runner = threading.Thread(target=loop.run, daemon=True)
    runner.start()
    runner.join(timeout=120)
    if runner.is_alive():
        loop.stop()
        pytest.fail("the reclaim was not noticed without a stale heartbeat:\n" +
                    "\n".join(log[-20:]))
    records = attempts.read_attempts(ctx, "train")
    assert [r["outcome"] for r in records] == ["lost", "success"], "\n".join(log[-30:])
    assert any("went away while running train-001" in ln for ln in log)
    assert "[tpu:0] finished step 4" in log


@pytest.mark.parametrize("how, state", [
    ("agent dies", "queued resource ACTIVE, node READY"),
    ("a person suspends it", "queued resource SUSPENDED (by the user), node PREEMPTED"),
])
def test_a_silent_agent_is_a_failure_unless_the_platform_took_the_tpu(fake_tpu, spot_tpu,
                                                                      tmp_path, how, state):
    cfg, ctx, vms = spot_tpu
    queued, node = tpu_render.tpu_names(cfg, ctx, PROJECT)
    log: list[str] = []
    _once_saved(log, lambda: vms.halt(node) if how == "agent dies"
                else fake_tpu.reclaim(queued, by="USER"))
    with pytest.raises(WorkerError) as err:
        _train_loop(cfg, ctx, tmp_path / "checkpoint", log).run()
    assert not isinstance(err.value, attempts.WorkerLost)
    message = str(err.value)
    assert "stopped answering while running train-001" in message
    assert f"the TPU API says: {state}." in message and "retry the task" in message
    assert [r["outcome"] for r in attempts.read_attempts(ctx, "train")] == ["failed"]
    assert len(_writes(fake_tpu)) == 1  # nothing deleted or queued again


def test_past_max_preemptions_a_taken_back_tpu_fails_and_the_retry_queues_it_again(
        fake_tpu, spot_tpu, tmp_path):
    cfg, ctx, _ = spot_tpu
    cfg = cfg.model_copy(update={"max_preemptions": 0})
    queued, _ = tpu_render.tpu_names(cfg, ctx, PROJECT)
    log: list[str] = []
    _once_saved(log, lambda: fake_tpu.reclaim(queued))
    with pytest.raises(WorkerError) as err:
        _train_loop(cfg, ctx, tmp_path / "checkpoint", log).run()
    message = str(err.value)
    assert "max_preemptions (0)" in message and "SUSPENDED" in message
    assert [r["outcome"] for r in attempts.read_attempts(ctx, "train")] == ["lost"]
    assert len(fake_tpu.calls("POST")) == 1
    # Airflow's retry of the task (a new attempt loop) queues the TPU again first.
    _train_loop(cfg, ctx, tmp_path / "checkpoint", log).run()
    assert [r["outcome"] for r in attempts.read_attempts(ctx, "train")] == ["lost", "success"]
    assert len(fake_tpu.calls("POST")) == 2 and "[tpu:0] finished step 4" in log


def test_a_spot_tpu_taken_back_between_steps_is_queued_again_for_the_next(fake_tpu, spot_tpu):
    """No step ran when the TPU went: the next step's request is never picked up."""
    cfg, ctx, vms = spot_tpu
    queued, node = tpu_render.tpu_names(cfg, ctx, PROJECT)
    fake_tpu.reclaim(queued)
    log: list[str] = []
    _train_loop(cfg, ctx, None, log, spec=_spec("evaluate", "print('evaluated')"),
                first_pickup_seconds=1.0).run()
    assert [r["outcome"] for r in attempts.read_attempts(ctx, "evaluate")] == ["lost", "success"]
    assert any("did not pick up evaluate-001" in ln and "attempt 1 was lost" in ln for ln in log)
    assert "[tpu:0] evaluated" in log and vms.booted == [node, node]


# --- the startup script, run by bash with fake commands -----------------------------------------
FAKE_COMMAND = """#!/bin/bash
# Records its call; fails while $STATE/<name>-<first arg>-fails counts down (docker info,
# docker pull), or always with $STATE/<name>-exit; curl prints $STATE/worker.
name=$(basename "$0")
echo "$name $*" >> "$STATE/calls"
if [ -f "$STATE/$name-exit" ]; then exit "$(cat "$STATE/$name-exit")"; fi
left="$STATE/$name-$1-fails"
if [ -f "$left" ] && [ "$(cat "$left")" -gt 0 ]; then
  echo $(( $(cat "$left") - 1 )) > "$left"; exit 1
fi
if [ "$name" = curl ]; then cat "$STATE/worker"; fi
exit 0
"""


def run_startup_script(tmp_path, *, worker="0", info_fails=0, pull_fails=0, curl_exit=None):
    """Run the rendered script with bash; docker, curl, gcloud, logger and sleep are fakes on
    PATH, the serial console a file. (calls, console lines, exit code, stdout)."""
    state, bin_dir = tmp_path / "state", tmp_path / "bin"
    state.mkdir()
    bin_dir.mkdir()
    for name in ("docker", "curl", "gcloud", "logger", "sleep"):
        (bin_dir / name).write_text(FAKE_COMMAND)
        (bin_dir / name).chmod(0o755)
    (state / "worker").write_text(worker)
    (state / "docker-info-fails").write_text(str(info_fails))
    (state / "docker-pull-fails").write_text(str(pull_fails))
    if curl_exit is not None:
        (state / "curl-exit").write_text(str(curl_exit))
    console = tmp_path / "ttyS0"
    console.write_text("")
    cfg = tpu_config("gs://b/root")
    script = tpu_render.startup_script(cfg, run_context("gs://b/root"))
    assert tpu_render.CONSOLE in script
    path = tmp_path / "startup.sh"
    path.write_text(script.replace(tpu_render.CONSOLE, str(console)))
    done = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "STATE": str(state)})
    calls = (state / "calls").read_text().splitlines() if (state / "calls").exists() else []
    return calls, console.read_text().splitlines(), done.returncode, done.stdout


def test_startup_script_waits_for_docker_and_retries_the_pull_with_backoff(tmp_path):
    calls, console, code, _ = run_startup_script(tmp_path, info_fails=2, pull_fails=2)
    assert code == 0, console
    image = tpu_render.worker_image(tpu_config("gs://b/root"))
    [curl] = [c for c in calls if c.startswith("curl ")]
    assert "-fsS" in curl and f"--retry {tpu_render.METADATA_RETRIES}" in curl
    assert "--retry-connrefused" in curl and "Metadata-Flavor: Google" in curl
    docker = [c for c in calls if c.startswith("docker ")]
    assert docker[:3] == ["docker info"] * 3
    assert docker[3:6] == [f"docker pull {image}"] * 3
    assert docker[6] == "docker rm -f bertflow-agent" and docker[7].startswith("docker run -d")
    # Docker's wait, then the pull's doubling backoff.
    assert [c for c in calls if c.startswith("sleep ")] == [
        "sleep 5", "sleep 5", f"sleep {tpu_render.PULL_FIRST_WAIT}",
        f"sleep {tpu_render.PULL_FIRST_WAIT * 2}"]
    # Every stage on the serial console (and the journal, tagged), in order.
    assert [ln.split(": ", 1)[1] for ln in console] == [
        "reading the worker number of this host from the metadata server",
        "waiting for docker", "configuring docker for us-docker.pkg.dev",
        f"pulling {image}", "pull attempt 1 of 6 failed; retrying in 5s",
        "pull attempt 2 of 6 failed; retrying in 10s", "starting the agent", "agent started"]
    assert all(ln.startswith("bertflow-startup: ") for ln in console)
    assert sum(c.startswith("logger -t bertflow-startup -- ") for c in calls) == len(console)


def test_startup_script_on_another_host_starts_nothing(tmp_path):
    calls, console, code, _ = run_startup_script(tmp_path, worker="1")
    assert code == 0 and not [c for c in calls if c.startswith("docker ")]
    assert console[-1] == "bertflow-startup: host 1: the TF worker runs on host 0"


@pytest.mark.parametrize("kwargs, reason", [
    (dict(curl_exit=22), "the metadata server did not answer agent-worker-number"),
    (dict(info_fails=1000), "docker did not answer within 300s"),
    (dict(pull_fails=1000), "could not pull us-docker.pkg.dev/"),
])
def test_startup_script_fails_with_the_stage_on_the_console(tmp_path, kwargs, reason):
    calls, console, code, _ = run_startup_script(tmp_path, **kwargs)
    assert code == 1
    assert console[-1].startswith(f"bertflow-startup: FAILED: {reason}"), console
    assert not [c for c in calls if c.startswith("docker run")]
    if "pull_fails" in kwargs:
        assert sum(c.startswith("docker pull ") for c in calls) == tpu_render.PULL_ATTEMPTS
