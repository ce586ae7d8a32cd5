"""bert_finetune with `provisioner: kubernetes`, through the whole task graph.

The control plane is the fake kube-apiserver of tests/fake_kubernetes.py (no cluster can run
here), reached by the real Kubernetes client through a kubeconfig; its process kubelet runs
every pod the backend creates as a real local process with the pod's command and environment
(credentials from the per-step Secret). The run folder, data and models live on the GCS
emulator, as a remote run needs. Everything else is real: dag.test(), the controllers, the
pods' TensorFlow workers, on the tiny random model (tests/train_helpers.py), which the pods
fetch from `base_model` on the GCS emulator: their "image" has no checkpoint (the offline
default's folder is hidden under an empty tmpfs in each pod) and each pod starts with an empty
cache, as a new container does.
"""
from __future__ import annotations

import json
import os
import subprocess
import uuid
from types import SimpleNamespace

import pytest

from fake_kubernetes import FakeKube, ProcessKubelet
from storage_servers import BUCKET, gcs_emulator  # noqa: F401
from tasks.io import storage
from tasks.config import DEMO_DIR
from tasks.io.uris import join_uri, sha256_file
from tasks.training import checkpoint_sources
from bertflow_airflow.demo import DAG_ID, run_folder
from dag_child import TASKS, TINY, finished_run, run_dags
from train_helpers import tiny_model_dir  # noqa: F401  (fixture)

GCS_CONN_ID = "bertflow_gcs_k8s"
GCS_TOKEN = "bertflow-k8s-token-93c1e07d5a"  # stands for the connection's credential

pytestmark = pytest.mark.skipif(not ProcessKubelet.available(),
                                reason="needs `unshare --mount` (root) for the pods' hosts")


@pytest.fixture(scope="module")
def k8s_run(airflow_db, gcs_emulator, tiny_model_dir, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("k8s-dag")
    conn = {"conn_type": "google_cloud_platform", "password": GCS_TOKEN,
            "extra": {"endpoint_url": gcs_emulator, "project": "bertflow-test"}}
    os.environ[f"AIRFLOW_CONN_{GCS_CONN_ID.upper()}"] = json.dumps(conn)
    storage.configure(storage.Connections(GCS_CONN_ID))
    prefix = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    storage.write_text(f"{prefix}/data/train.tsv", (DEMO_DIR / "train.tsv").read_text())
    storage.write_text(f"{prefix}/data/eval.tsv", (DEMO_DIR / "eval.tsv").read_text())
    storage.upload_dir(tiny_model_dir, f"{prefix}/checkpoints/tiny-bert")
    conf = {**TINY, "provisioner": "kubernetes", "k8s_namespace": "default",
            "train_uri": f"{prefix}/data/train.tsv", "eval_uri": f"{prefix}/data/eval.tsv",
            "artifact_root": f"{prefix}/artifacts", "gcp_conn_id": GCS_CONN_ID,
            "base_model": f"{prefix}/checkpoints/tiny-bert"}
    kubelet = ProcessKubelet(tmp / "pods", hidden=(checkpoint_sources.default_base_model_dir(),),
                             own_cache=True)
    with FakeKube(kubelet) as kube:
        env = {**os.environ, "KUBECONFIG": str(kube.write_kubeconfig(tmp / "kubeconfig"))}
        output, parts = run_dags({"kubernetes": conf}, env=env)
        dag_run = finished_run("kubernetes", parts["kubernetes"], output)
        yield SimpleNamespace(kube=kube, log=output, conf=conf, dag_run=dag_run,
                              run_uri=run_folder(dag_run, conf["artifact_root"]),
                              kubelet=kubelet, tiny=tiny_model_dir)
    os.environ.pop(f"AIRFLOW_CONN_{GCS_CONN_ID.upper()}", None)
    storage.configure(storage.Connections())


def test_every_task_succeeds_with_pods_doing_the_work(k8s_run):
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        states = dict(session.query(TaskInstance.task_id, TaskInstance.state)
                      .filter_by(dag_id=DAG_ID, run_id=k8s_run.dag_run.run_id))
    assert states == {**dict.fromkeys(TASKS, "success"), "approval": "skipped"}, k8s_run.log[-5000:]
    jobs = k8s_run.kube.created_names("jobs")
    for step in ("tokenize", "train", "export"):
        assert any(f"-{step}-" in name for name in jobs), (step, jobs)
    # The train pods evaluated the model in memory (evaluate_in_train): the evaluate task
    # published their metrics and created no Job.
    assert not any("-evaluate-" in name for name in jobs), jobs
    evaluated = storage.read_json(join_uri(k8s_run.run_uri, "evaluate", "manifest.json"))
    assert evaluated["evaluated_in"] == "train"
    # The pods' own output reached the controllers' task logs, prefixed.
    assert "[worker:0]" in k8s_run.log
    # ... and each pod's log is kept in the run folder, although its pod is gone; the
    # preflight ran first and passed.
    for step in ("tokenize", "train", "export"):
        kept = storage.read_text(join_uri(k8s_run.run_uri, step, "logs", "worker-0.log"))
        assert kept.strip() and f"{step}/manifest.json" in kept, (step, kept[-2000:])
    assert storage.read_json(join_uri(k8s_run.run_uri, "provision", "preflight.json"))["ok"]
    exported = storage.read_json(join_uri(k8s_run.run_uri, "export", "manifest.json"))
    assert storage.is_complete(exported["version_uri"])


def test_nothing_is_left_on_the_cluster_and_release_says_so(k8s_run):
    kube = k8s_run.kube
    for plural in ("jobs", "pods", "services", "secrets"):
        assert kube.names(plural) == [], plural
    # Every delete carried a propagation policy, so no Job left its pods behind.
    job_deletes = [d for d in kube.deletes if d.get("plural") == "jobs"]
    assert job_deletes and all(d.get("propagationPolicy") in ("Background", "Foreground")
                               for d in job_deletes), job_deletes[:3]
    released = storage.read_json(join_uri(k8s_run.run_uri, "release", "manifest.json"))
    assert released["backend"] == "kubernetes"


def test_the_credential_reaches_pods_only_through_their_secret(k8s_run):
    assert GCS_TOKEN not in k8s_run.log
    secrets = [o for o in k8s_run.kube.created if o.get("kind") == "Secret"]
    assert secrets, "the connection's credential should travel in a per-step Secret"
    for obj in k8s_run.kube.created:
        if obj.get("kind") != "Secret":
            assert GCS_TOKEN not in json.dumps(obj), obj["metadata"]["name"]
    provision = storage.read_text(join_uri(k8s_run.run_uri, "provision", "manifest.json"))
    assert GCS_TOKEN not in provision


def test_pods_fetch_base_model_from_the_bucket_with_no_checkpoint_in_the_image(k8s_run):
    hidden = checkpoint_sources.default_base_model_dir()
    # The hiding is real: in a pod's mount namespace the default's folder is empty.
    probe = subprocess.run(["unshare", "--mount", "sh", "-c",
                            k8s_run.kubelet.mounts() + ' && ls -A "$1"', "/etc/hosts",
                            str(hidden)], capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout == "", probe
    assert (hidden / "config.json").is_file()  # ...and only there
    trained = storage.read_json(join_uri(k8s_run.run_uri, "train", "manifest.json"))
    base = trained["base_checkpoint"]
    assert (base["kind"], base["location"]) == ("bucket", k8s_run.conf["base_model"])
    assert base["sha256"] == sha256_file(k8s_run.tiny / "model.safetensors")
    # Each pod fetched into its own, new cache (tokenize and train pods alike).
    fetched = sorted(k8s_run.kubelet.workdir.glob("*.tmp/cache/bertflow/checkpoints/folders/*"))
    assert len({p.parts[-6] for p in fetched}) >= 2, fetched
    exported = storage.read_json(join_uri(k8s_run.run_uri, "export", "manifest.json"))
    card = storage.read_text(join_uri(exported["version_uri"], "model_card.md"))
    assert k8s_run.conf["base_model"] in card and base["sha256"] in card
