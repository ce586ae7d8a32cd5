"""The score step of bert_batch_score on the remote backends, without a cloud: a 2-worker
scoring run (tests/test_scoring.py's promoted tiny classifier, its input and output in the
GCS emulator, as remote workers need) driven through the attempt loop the DAG's score task
runs, by each backend's real client over real HTTP:

- Kubernetes: the objects rendered for the run validate strictly against the Kubernetes
  OpenAPI schema; the real `kubernetes` client creates them in the fake API server
  (tests/fake_kubernetes.py), whose ProcessKubelet runs each pod's command as a local
  process (TF_CONFIG built in the pod from its Indexed Job's completion index).
- Vertex AI: the rendered CustomJob parses as one (unknown fields refused); the real
  JobServiceClient submits it to the fake JobService (tests/fake_vertex.py), which here runs
  the job's replicas as local processes with TF_CONFIG as Vertex AI writes it: worker 0 of a
  workers-only cluster is pool 0, the task type "chief".

Each checks that every shard was scored once, by the worker it belongs to, and that every
input row is in the output once (publish's counts and _COMPLETE.json).
"""
from __future__ import annotations

import re
import threading

import kubernetes_validate
import pytest

from fake_kubernetes import FakeKube, ProcessKubelet
from fake_vertex import FakeVertex
from storage_servers import BUCKET, gcs_emulator  # noqa: F401  (fixture)
from tasks.errors import WorkerError
from tasks.io import storage
from tasks.io.uris import COMPLETE, join_uri
from tasks.provision.attempts import read_attempts, run_step
from tasks.provision.spec import scoring_spec
from tasks.runs.runlayout import RunContext, init_run
from tasks.score_config import parse_score_config, run_config
from tasks.scoring import plan as scoring_plan
from test_kubernetes import K8S_VERSION, SECRETS
from test_kubernetes_train import free_port_block
from test_scoring import output_ids, score_values, store, write_input  # noqa: F401
from test_vertex_ai import VERTEX, pointed_at
from test_vertex_ai_train import VertexReplicas

ROWS, SHARD_ROWS = 24, 5  # 27 records (3 unreadable): 6 shards, 3 per worker
SCORED = re.compile(r"^\[(\w+):(\d+)\] score: (part-\d{5}): (\d+) rows")


def scoring_run(store, tmp_path, name: str, **values) -> tuple:  # noqa: F811
    """A planned 2-worker scoring run of `name` whose input and output are in the bucket;
    (RunConfig, RunContext, plan, input ids)."""
    local = tmp_path / "in.tsv"
    ids = write_input(local, ROWS, seed=3)
    storage.write_bytes(f"gs://{BUCKET}/{name}/in/tickets.tsv", local.read_bytes())
    cfg = parse_score_config(score_values(
        store, tmp_path, input_uri=f"gs://{BUCKET}/{name}/in/",
        output_uri=f"gs://{BUCKET}/{name}/scores", num_workers=2, shard_rows=SHARD_ROWS,
        batch_size=4, **values))
    ctx = RunContext(store["root"], "bert_batch_score", name, name)
    init_run(run_config(cfg), ctx)
    plan = scoring_plan.make_plan(cfg, ctx)
    assert plan["num_workers"] == 2 and len(plan["shards"]) == 6
    return run_config(cfg), ctx, plan, ids


def score_through(backend, cfg, ctx, plan) -> list[str]:
    """The score step as the DAG's score task runs it: the attempt loop over the backend."""
    lines: list[str] = []
    spec = scoring_spec(ctx.run_uri, plan["num_workers"], accelerated=False)
    try:
        run_step(backend, cfg, ctx, spec, log=lines.append, secrets={}).run()
    except WorkerError as err:
        raise AssertionError(f"score failed: {err}\n" + "\n".join(lines[-60:])) from None
    assert [a["outcome"] for a in read_attempts(ctx, "score")] == ["success"]
    return lines


def assert_scored_once(ctx, plan, ids, lines, workers: dict[str, int]) -> None:
    """Each shard scored in exactly one log line, by the worker at position index mod 2
    (`workers`: log role -> position of its index 0), and every input row output once."""
    scored = [SCORED.match(line) for line in lines]
    by_shard: dict[str, list[int]] = {}
    for m in filter(None, scored):
        by_shard.setdefault(m.group(3), []).append(workers[m.group(1)] + int(m.group(2)))
    assert by_shard == {s["name"]: [s["index"] % 2] for s in plan["shards"]}, \
        "\n".join(lines[-60:])
    got = output_ids(plan["output_uri"])
    assert sorted(got) == sorted(ids) and len(got) == len(set(got)) == ROWS
    from tasks.scoring.publish import publish

    summary = publish(ctx)
    assert (summary["rows"], summary["error_rows"], summary["shards"]) == (ROWS, 3, 6)
    complete = storage.read_json(join_uri(summary["output_uri"], COMPLETE))
    assert complete["input_rows"] == ROWS + 3 and len(complete["files"]) == 6


# --- Kubernetes ------------------------------------------------------------------------------

def test_kubernetes_pods_validate_and_score_each_shard_once(
        store, gcs_emulator, tmp_path, monkeypatch):  # noqa: F811
    from tasks.provision.kubernetes import render
    from tasks.provision.kubernetes.backend import KubernetesBackend

    if not ProcessKubelet.available():
        pytest.skip("needs `unshare --mount` (root) for pod hostnames")
    cfg, ctx, plan, ids = scoring_run(store, tmp_path, "kube", provisioner="kubernetes")
    spec = scoring_spec(ctx.run_uri, plan["num_workers"], accelerated=False)
    objects = KubernetesBackend().render(cfg, ctx, spec)
    created = render.render_objects(cfg, ctx, spec, secret_values=SECRETS, owner_uid="1-uid")
    assert [o["kind"] for o in objects] == ["Service", "Job"]
    for obj in objects + created:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    job = objects[-1]
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] + container.get("args", []) == [
        "python", "-m", "tasks", "score", "--run-dir", ctx.run_uri]

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with FakeKube(ProcessKubelet(tmp_path / "kubelet")) as kube:
        monkeypatch.setenv("KUBECONFIG", str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
        backend = KubernetesBackend(poll_seconds=0.2, grace_seconds=30,
                                    base_port=free_port_block(2), _shares_host_disk=True)
        lines = score_through(backend, cfg, ctx, plan)
        assert kube.kubelet.live_processes(wait=30) == []
    assert_scored_once(ctx, plan, ids, lines, {"worker": 0})


# --- Vertex AI -------------------------------------------------------------------------------

class RunningVertex(FakeVertex):
    """The fake JobService whose CustomJobs run: a created job's replicas start as local
    processes (VertexReplicas); the job is RUNNING while they run, then SUCCEEDED or FAILED
    with their error. A cancel stops them."""

    def __init__(self):
        super().__init__()
        self.script = ["JOB_STATE_PENDING", "JOB_STATE_RUNNING"]  # until the replicas end
        self.lines: list[str] = []
        self.replicas: dict[str, VertexReplicas] = {}
        self.threads: list[threading.Thread] = []

    def create(self, location: str, body: str) -> tuple[int, dict]:
        code, job = super().create(location, body)
        if code == 200:
            self.replicas[job["name"]] = VertexReplicas(job, self.lines.append,
                                                        grace_seconds=30)
            thread = threading.Thread(target=self._run, args=(job["name"],), daemon=True)
            self.threads.append(thread)
            thread.start()
        return code, job

    def _run(self, name: str) -> None:
        try:
            self.replicas[name].run()
            end = "JOB_STATE_SUCCEEDED"
        except WorkerError as err:
            end = ("JOB_STATE_FAILED", str(err))
        with self.lock:
            if self.jobs[name].state.name != "JOB_STATE_CANCELLED":
                self.scripts[name] = [end]
                self._set_state(self.jobs[name], end)

    def cancel(self, name: str) -> tuple[int, dict]:
        if name in self.replicas:
            self.replicas[name].stop()
        return super().cancel(name)


@pytest.fixture
def vertex(monkeypatch):
    server = pointed_at(RunningVertex(), monkeypatch)
    yield server
    for replicas in server.replicas.values():
        replicas.stop()
    for thread in server.threads:
        thread.join(timeout=30)
    server.stop()


def test_vertex_ai_job_parses_and_its_replicas_score_each_shard_once(
        store, gcs_emulator, vertex, tmp_path):  # noqa: F811
    from google.cloud.aiplatform_v1 import CustomJob
    from google.protobuf import json_format

    from tasks.provision.backends import backend_for

    cfg, ctx, plan, ids = scoring_run(store, tmp_path, "vertex", **VERTEX)
    backend = backend_for(cfg)
    spec = scoring_spec(ctx.run_uri, plan["num_workers"], accelerated=False)
    [job] = backend.render(cfg, ctx, spec)
    json_format.ParseDict(job, CustomJob.pb()())  # a CustomJob: unknown fields refused
    pools = job["jobSpec"]["workerPoolSpecs"]
    assert [int(p["replicaCount"]) for p in pools] == [1, 1]  # chief (worker 0), worker 1
    for pool in pools:
        assert "acceleratorType" not in pool["machineSpec"]
        # the step's command, under the writer that keeps the replica's log in the run folder
        assert pool["containerSpec"]["command"][-6:] == [
            "python", "-m", "tasks", "score", "--run-dir", ctx.run_uri]

    score_through(backend, cfg, ctx, plan)
    assert len(vertex.created()) == 1 and vertex.cancels == []
    assert vertex.state(vertex.created()[0]) == "JOB_STATE_SUCCEEDED"
    # The replicas' own output (the controller sees only the job's states, as on Vertex AI).
    assert_scored_once(ctx, plan, ids, vertex.lines, {"chief": 0, "worker": 1})
