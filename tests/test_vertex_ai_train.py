"""One spec, many backends, really trained: the worker pools the Vertex AI backend renders,
run replica by replica as local processes with TF_CONFIG exactly as Vertex AI writes it
(cluster roles chief / worker / ps, task {"type", "index", "trial": ""}, "environment":
"cloud", "job": the CustomJobSpec), train the same weights as the local backend's cluster.

- multi_worker_mirrored, 2 workers: Vertex AI runs pool 0 (chief) + pool 1 (1 worker); the
  local backend runs worker 0 + worker 1. MWMS counts a chief as task 0 of the all-reduce,
  so both are the same 2-replica synchronous training: same weights.
- parameter_server: pools 0, 1, 2 against the local cluster of the same shape. With one
  worker (chief + 1 worker + 1 ps) the steps run in order: same weights, bitwise. With two
  workers (chief + 2 workers + 1 ps) training is asynchronous (the coordinator hands each
  step to whichever worker is free), so even two local runs differ (measured: max |weight
  difference| 0.09, as large as what training moves); that case asserts the pools train the
  full plan (tasks.training.model.make_plan), with every role serving, rather than equal
  weights, and trains no local reference: test_distributed trains that shape locally.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from tasks.errors import WorkerError
from tasks.provision.local.cluster import LocalCluster
from tasks.provision.spec import WorkerSpec, step_spec
from tasks.provision.backends import backend_for
from tasks.io import storage
from tasks.provision.vertex_ai.backend import POOL_ROLES
from tasks.training.model import make_plan
from tasks.provision.worker_logs import log_uri
from tasks.runs.runlayout import read_manifest
from test_distributed import COMMON, FIXED, NUM_EVAL, NUM_TRAIN, WEIGHT_ATOL
from train_helpers import saved_weights, make_run, run_cluster, write_tiny_model

VERTEX = dict(provisioner="vertex_ai", gcp_project="proj", gcp_region="us-central1",
              image_registry="us-docker.pkg.dev/proj/repo")


class VertexReplicas(LocalCluster):
    """Runs a rendered CustomJob's replicas as local processes: each pool's container command
    and environment, the TF_CONFIG Vertex AI would set (addresses on loopback)."""

    def __init__(self, job: dict, log, **kwargs):
        from google.cloud.aiplatform_v1 import CustomJob
        from google.protobuf import json_format

        # The rendered JSON is a valid CustomJob; "job" in TF_CONFIG is its spec, as Vertex
        # AI writes it (snake_case field names).
        proto = json_format.ParseDict(job, CustomJob.pb()())
        self.job_spec = json_format.MessageToDict(proto.job_spec,
                                                  preserving_proto_field_name=True)
        pools = job["jobSpec"]["workerPoolSpecs"]
        self.pool_env = {role: {e["name"]: e["value"] for e in p["containerSpec"]["env"]}
                         for role, p in zip(POOL_ROLES, pools) if p}
        counts = {role: int(p["replicaCount"]) for role, p in zip(POOL_ROLES, pools) if p}
        commands = {tuple(p["containerSpec"]["command"]) for p in pools if p}
        assert len(commands) == 1, commands  # every pool runs the step's one command
        cluster = counts if sum(counts.values()) > 1 else {}
        # Pools with a ps pool are parameter-server training (its workers serve until
        # stopped); otherwise every replica runs the program to its end.
        strategy = "parameter_server" if counts.get("ps") else "multi_worker_mirrored"
        command = list(commands.pop())  # ... python -m tasks STEP --run-dir RUN
        super().__init__(WorkerSpec(command=command, cluster=cluster, strategy=strategy,
                                    step=command[-3]), log, **kwargs)

    def _env(self, role, index, addresses):
        env = super()._env(role, index, addresses)
        env.update(self.pool_env[role])
        if addresses:
            env["TF_CONFIG"] = json.dumps({
                "cluster": addresses, "task": {"type": role, "index": index, "trial": ""},
                "environment": "cloud", "job": self.job_spec})
        return env


def run_vertex_pools(cfg, ctx, step: str = "train") -> list[str]:
    [job] = backend_for(cfg).render(cfg, ctx, step_spec(cfg, step, ctx.run_uri))
    lines: list[str] = []
    try:
        VertexReplicas(job, lines.append, grace_seconds=60).run()
    except WorkerError as err:
        raise AssertionError(f"{step} failed: {err}\n" + "\n".join(lines[-60:])) from None
    return lines


def with_local_cluster(local, run):
    """run() while the local cluster trains `local` (cfg, ctx) in a thread: two independent
    runs, overlapped rather than one after the other (each process spends most of its time
    starting up and tracing). run()'s result."""
    failed: list = []

    def train_locally():
        try:
            run_cluster(*local, "train")
        except AssertionError as err:
            failed.append(err)

    thread = threading.Thread(target=train_locally)
    thread.start()
    try:
        result = run()
    finally:
        thread.join()
    if failed:
        raise failed[0]
    return result


def trained_weights(ctx) -> tuple[dict, dict]:
    manifest = read_manifest(ctx.manifest_uri("train"))
    return manifest, saved_weights(Path(manifest["model_dir"]))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"), hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)


def test_mwms_chief_plus_worker_trains_what_two_local_workers_train(tmp_path, tiny_model):
    # 3 epochs, 12 steps: as tests/test_kubernetes_train.py, ample to tell the weights apart
    # No test evaluation after training: the weights are compared (and the chief's log still
    # ends with the manifest URI).
    shape = dict(strategy="multi_worker_mirrored", num_workers=2, evaluate_in_train=False,
                 **{**COMMON, "epochs": 3}, **VERTEX)
    local = make_run(tmp_path / "local", tiny_model, NUM_TRAIN, NUM_EVAL, FIXED, **shape)
    vertex = make_run(tmp_path / "vertex", tiny_model, NUM_TRAIN, NUM_EVAL, FIXED, **shape)
    lines = with_local_cluster(local, lambda: run_vertex_pools(*vertex))

    (a_manifest, a), (b_manifest, b) = trained_weights(local[1]), trained_weights(vertex[1])
    for manifest in (a_manifest, b_manifest):
        assert manifest["strategy"] == "multi_worker_mirrored"
        assert manifest["num_replicas"] == 2 and manifest["steps"] == 12
    assert any(ln.startswith("[chief:0] ") for ln in lines)
    assert any(ln.startswith("[worker:0] ") for ln in lines)
    # Each replica kept its own log in the run folder (the worker-side writer); the chief's
    # ends with the step's manifest URI, which `python -m tasks train` prints last.
    logs = {role: storage.read_text(log_uri(vertex[1].run_uri, "train", role, 0))
            for role in ("chief", "worker")}
    assert logs["chief"].rstrip().endswith(vertex[1].manifest_uri("train"))
    assert logs["worker"].strip()
    base = saved_weights(Path(tiny_model))
    moved = max(float(np.abs(b[k] - base[k]).max()) for k in b)
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    print(f"MWMS chief+worker (Vertex AI pools) vs worker+worker (local): max |weight "
          f"difference| {diff:.3g}; training moved weights by up to {moved:.3g}")
    assert a.keys() == b.keys() and moved > 100 * WEIGHT_ATOL
    assert diff <= WEIGHT_ATOL


@pytest.mark.parametrize("workers", [1, 2])
def test_parameter_server_pools_train_like_the_local_cluster(tmp_path, tiny_model, workers):
    # A checkpoint at step 8 of 16, not every 4: each parameter-server checkpoint (and the fit
    # call it ends) took ~4.5 s; one mid-run still splits the run into fit calls.
    shape = dict(strategy="parameter_server", num_workers=workers, num_ps=1,
                 **{**COMMON, "epochs": 2, "checkpoint_every_steps": 8}, **VERTEX)
    vertex = make_run(tmp_path / "vertex", tiny_model, NUM_TRAIN, NUM_EVAL, FIXED, **shape)
    if workers == 1:  # the reference (below): the local cluster of the same shape, meanwhile
        local = make_run(tmp_path / "local", tiny_model, NUM_TRAIN, NUM_EVAL, FIXED, **shape)
        lines = with_local_cluster(local, lambda: run_vertex_pools(*vertex))
    else:
        lines = run_vertex_pools(*vertex)
    b_manifest, b = trained_weights(vertex[1])
    # A parameter-server step runs on one worker: one replica in sync (per CPU worker).
    plan = make_plan(vertex[0], NUM_TRAIN, num_replicas=1)
    assert b_manifest["strategy"] == "parameter_server" and b_manifest["num_replicas"] == 1
    assert b_manifest["steps"] == b_manifest["total_steps"] == plan.total_steps > 0
    assert np.isfinite(b_manifest["final_loss"])
    assert any(ln.startswith("[ps:0] serving as ps 0") for ln in lines)
    assert any(ln.startswith(f"[worker:{workers - 1}] serving as worker {workers - 1}")
               for ln in lines)
    base = saved_weights(Path(tiny_model))
    moved = max(float(np.abs(b[k] - base[k]).max()) for k in b)
    assert b.keys() == base.keys() and moved > 100 * WEIGHT_ATOL
    if workers == 2:
        # Asynchronous: even two local runs differ, so there is no reference to match.
        # test_distributed.test_parameter_server_trains_with_fit trains this shape locally.
        return
    # One worker runs the steps in order: deterministic, so the local cluster of the same
    # shape must train the same weights.
    a_manifest, a = trained_weights(local[1])
    assert a_manifest["total_steps"] == plan.total_steps and a.keys() == b.keys()
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    print(f"parameter_server (1 worker) Vertex AI pools vs local cluster: max |weight "
          f"difference| {diff:.3g}; training moved weights by up to {moved:.3g}; final loss "
          f"{b_manifest['final_loss']:.4g} vs {a_manifest['final_loss']:.4g}")
    assert diff <= WEIGHT_ATOL
