"""The worker spec: what to run, with which environment, in which cluster shape.

A backend (tasks/provision/backends.py: local processes, Kubernetes Jobs, a Vertex AI
CustomJob, a Cloud TPU VM) renders one spec into processes. The spec is plain data so it can be written to the provision manifest and read back
by the controller task (or rendered into a pod template) without importing TensorFlow.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field

from tasks.config import PROJECT_ROOT, RunConfig
from tasks.topology import Topology, cluster_shape, resolve_strategy_name

def run_hash(run_uri: str, digits: int) -> str:
    """A short stable id of a run (from its folder URI) for names and labels; each backend
    takes as many hex digits as its naming limits allow."""
    return hashlib.sha256(run_uri.encode()).hexdigest()[:digits]


# Every worker process needs these; the rest of its environment comes from the backend.
BASE_ENV = {"TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class WorkerSpec:
    # argv every process runs; "python" is the backend's interpreter (the image's python, or
    # the controller's own interpreter for local processes).
    command: list[str]
    env: dict[str, str] = field(default_factory=lambda: dict(BASE_ENV))
    # TF_CONFIG roles -> process count; empty means one process without TF_CONFIG.
    cluster: dict[str, int] = field(default_factory=dict)
    strategy: str = ""
    # The pipeline step it runs; accelerated steps (train, evaluate) get the configured
    # GPUs/TPUs on remote backends, the others (tokenize, export) a CPU-only worker.
    step: str = ""
    accelerated: bool = False

    @property
    def roles(self) -> list[tuple[str, int]]:
        """(role, index) of every process, chief first; [("worker", 0)] when single."""
        if not self.cluster:
            return [("worker", 0)]
        order = ["chief", "worker", "ps"]
        return [(role, i) for role in order for i in range(self.cluster.get(role, 0))]

    @property
    def main_role(self) -> tuple[str, int]:
        """The process whose success ends the job: the chief, else worker 0 (MWMS/single)."""
        return ("chief", 0) if self.cluster.get("chief") else ("worker", 0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "WorkerSpec":
        return cls(command=list(data["command"]), env=dict(data["env"]),
                   cluster=dict(data["cluster"]), strategy=data["strategy"],
                   step=data.get("step", ""), accelerated=data.get("accelerated", False))


def step_command(step: str, run_uri: str) -> list[str]:
    return ["python", "-m", "tasks", step, "--run-dir", run_uri]


def distributed_spec(cfg: RunConfig, step: str, run_uri: str) -> WorkerSpec:
    """Spec for train/evaluate: strategy and cluster shape from the configured topology."""
    topology = Topology.from_config(cfg)
    strategy = resolve_strategy_name(topology, cfg.strategy)
    return WorkerSpec(command=step_command(step, run_uri), cluster=cluster_shape(strategy, topology),
                      strategy=strategy, step=step, accelerated=True)


def single_process_spec(step: str, run_uri: str) -> WorkerSpec:
    """Spec for steps that import TensorFlow but need no cluster (tokenize, export)."""
    return WorkerSpec(command=step_command(step, run_uri), step=step)


def scoring_spec(run_uri: str, workers: int, accelerated: bool) -> WorkerSpec:
    """Spec for a batch-scoring run (tasks/steps/score.py): `workers` independent processes
    that learn their index from TF_CONFIG and build no strategy."""
    return WorkerSpec(command=step_command("score", run_uri),
                      cluster={"worker": workers} if workers > 1 else {}, step="score",
                      accelerated=accelerated)


def process_env(environ, *updates: dict[str, str]) -> dict[str, str]:
    """A step process's environment: the controller's, `updates` on top, without a stale
    TF_CONFIG (single-process strategies must not see one), and with this checkout first on
    PYTHONPATH (`python -m tasks` must resolve here whatever the caller's cwd/sys.path)."""
    env = dict(environ)
    env.pop("TF_CONFIG", None)
    for update in updates:
        env.update(update)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


DISTRIBUTED_STEPS = ("train", "evaluate")
# Steps that run as workers (they read the data or import TensorFlow), in pipeline order.
WORKER_STEPS = ("data", "tokenize", "train", "evaluate", "export")


def step_spec(cfg: RunConfig, step: str, run_uri: str) -> WorkerSpec:
    if step in DISTRIBUTED_STEPS:
        return distributed_spec(cfg, step, run_uri)
    return single_process_spec(step, run_uri)
