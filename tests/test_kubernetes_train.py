"""One spec, many backends, really trained: the pods the kubernetes backend renders train the
same model as the local backend's processes.

The fake API server (tests/fake_kubernetes.py) runs each pod's container with its
`ProcessKubelet`: the rendered command and env (role, cluster of `<job>-<index>.<service>`
addresses, JOB_COMPLETION_INDEX from the Job), so `python -m tasks train` builds its TF_CONFIG
exactly as in a real pod, and the pods find each other through a private /etc/hosts. The
same config and seed run through `LocalCluster`; the trained weights are compared.

- multi_worker_mirrored, 2 workers: synchronous, so the weights must agree to float rounding.
- parameter_server, chief + 2 workers + 1 ps: the coordinator hands steps to whichever worker
  is free, so updates arrive in a run-dependent order and no two runs (not even two local
  ones) have the same weights; both must finish the same plan and fit the training rows.

The run folder is local (the pods run on this host): the backend's test-only seam skips the
bucket check.
"""
from __future__ import annotations

import random
import socket
import threading
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from fake_kubernetes import FakeKube, ProcessKubelet
from tasks.errors import WorkerError
from tasks.provision.kubernetes.backend import KubernetesBackend
from tasks.provision.spec import distributed_spec
from tasks.runs.runlayout import RunContext, read_manifest
from train_helpers import (saved_weights, make_run, run_cluster, single_device_matrix,
                           write_tiny_model)

pytestmark = pytest.mark.skipif(not ProcessKubelet.available(),
                                reason="needs `unshare --mount` (root) for pod hostnames")

# As tests/test_distributed.py: a tiny model, fixed-length rows, float32.
NUM_TRAIN, NUM_EVAL, FIXED = 64, 41, (10, 10)
# No test evaluation after training: these tests compare weights (test_dag_kubernetes has
# pods evaluate in memory).
COMMON = dict(per_replica_batch_size=8, epochs=3, eval_batch_size=8, learning_rate=1e-2,
              warmup_ratio=0.25, weight_decay=0.01, checkpoint_every_steps=4,
              evaluate_in_train=False)
WEIGHT_ATOL = 1e-5  # MWMS: the same arithmetic on the same batches


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"), hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)


def free_port_block(count: int) -> int:
    """A base port with `count` free consecutive ports after it (the backend gives each
    task base + position; all pods share this host). Below the kernel's ephemeral range: a
    port in it that is free now can become a connection's local port before the pod binds
    it (a PS chief once failed so, 'Could not start gRPC server', beside a busy test run)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        high = int(f.read().split()[0]) - count
    for _ in range(200):
        base = random.randrange(10000, max(high, 10001))
        try:
            with ExitStack() as stack:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no block of free ports")


def run_on_kubernetes(cfg, ctx, step: str, workdir: Path, monkeypatch) -> list[str]:
    """The step's spec through the kubernetes backend, pods as local processes."""
    lines: list[str] = []
    spec = distributed_spec(cfg, step, ctx.run_uri)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with FakeKube(ProcessKubelet(workdir / "kubelet")) as kube:
        monkeypatch.setenv("KUBECONFIG", str(kube.write_kubeconfig(workdir / "kubeconfig")))
        backend = KubernetesBackend(poll_seconds=0.2, grace_seconds=60,
                                    base_port=free_port_block(len(spec.roles)),
                                    _shares_host_disk=True)
        try:
            backend.controller(cfg, ctx, spec, log=lines.append, secrets={}).run()
        except WorkerError as err:
            raise AssertionError(f"{step} failed: {err}\n" + "\n".join(lines[-60:])) from None
        # the step's teardown deleted every pod, and the kubelet killed their processes
        assert kube.kubelet.live_processes(wait=30) == []
    return lines


def train_both(tmp_path, tiny_model, monkeypatch, **shape) -> tuple:
    """The same run trained by both backends, concurrently; (local, kubernetes) manifests
    and the kubernetes log lines."""
    values = {**COMMON, **shape}
    local = make_run(tmp_path / "local", tiny_model, NUM_TRAIN, NUM_EVAL, FIXED, **values)
    kube = make_run(tmp_path / "kube", tiny_model, NUM_TRAIN, NUM_EVAL, FIXED,
                    provisioner="kubernetes", **values)
    outcome: dict = {}

    def local_run():
        try:
            run_cluster(*local, "train")
        except AssertionError as err:
            outcome["local"] = err

    thread = threading.Thread(target=local_run)
    thread.start()
    try:
        lines = run_on_kubernetes(*kube, "train", tmp_path, monkeypatch)
    finally:
        thread.join()
    if "local" in outcome:
        raise outcome["local"]
    return (read_manifest(local[1].manifest_uri("train")),
            read_manifest(kube[1].manifest_uri("train")), lines)


def local_ctx(tmp_path: Path, which: str = "local") -> RunContext:
    return RunContext(artifact_root=str(tmp_path / which), dag_id="test", run_key="run1")


def weight_difference(a_manifest: dict, b_manifest: dict, base_dir: Path) -> tuple:
    a = saved_weights(Path(a_manifest["model_dir"]))
    b = saved_weights(Path(b_manifest["model_dir"]))
    base = saved_weights(base_dir)
    assert a.keys() == b.keys() and len(a) > 30
    moved = max(float(np.abs(a[k] - base[k]).max()) for k in a)
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    return diff, moved


def test_mwms_pods_train_the_same_weights_as_local_processes(tmp_path, tiny_model,
                                                             monkeypatch):
    local, kube, lines = train_both(tmp_path, tiny_model, monkeypatch,
                                    strategy="multi_worker_mirrored", num_workers=2)
    for manifest in (local, kube):
        assert manifest["strategy"] == "multi_worker_mirrored"
        assert manifest["num_replicas"] == 2 and manifest["steps"] == 12
    for task in ("[worker:0]", "[worker:1]"):
        assert any(ln.startswith(f"{task} ") for ln in lines)
    diff, moved = weight_difference(local, kube, tiny_model)
    print(f"kubernetes vs local MWMS: max |weight difference| {diff:.3g} (training moved "
          f"weights by up to {moved:.3g})")
    assert moved > 100 * WEIGHT_ATOL
    assert diff <= WEIGHT_ATOL


def test_parameter_server_pods_train_like_local_processes(tmp_path, tiny_model, monkeypatch):
    # A checkpoint every 16 of the 48 steps, not every 4: each parameter-server checkpoint
    # (and the fit call it ends) took ~4.5 s, most of the run; two still fall mid-run.
    local, kube, lines = train_both(tmp_path, tiny_model, monkeypatch,
                                    strategy="parameter_server", num_workers=2, num_ps=1,
                                    epochs=6, checkpoint_every_steps=16)
    for manifest in (local, kube):
        assert manifest["strategy"] == "parameter_server"
        assert manifest["steps"] == manifest["total_steps"] == local["total_steps"] > 0
    assert any(ln.startswith("[ps:0] serving as ps 0") for ln in lines)
    assert any(ln.startswith("[worker:1] serving as worker 1") for ln in lines)
    diff, moved = weight_difference(local, kube, tiny_model)
    print(f"kubernetes vs local parameter_server: max |weight difference| {diff:.3g} "
          f"(training moved weights by up to {moved:.3g})")
    # Asynchronous updates: not the same weights, but both sides fit the training rows. Not
    # the held-out rows: 64 rows leave generalization to chance. In 35 runs on a loaded machine
    # every model fitted all training rows (smallest margin 4.97 logits), while two sent one or
    # two held-out rows confidently wrong, and a CI run seven.
    matrices = [single_device_matrix(Path(m["model_dir"]), ctx, split="train") for m, ctx in
                ((local, local_ctx(tmp_path)), (kube, local_ctx(tmp_path, "kube")))]
    for matrix in matrices:
        assert matrix.sum() == NUM_TRAIN and np.trace(matrix) >= 0.95 * NUM_TRAIN, matrices
