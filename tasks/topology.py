"""Topology -> strategy name and cluster shape. Pure Python: the Airflow controller uses it
without importing TensorFlow; `tasks.training.strategy` builds the actual tf.distribute object."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from tasks.errors import ConfigError

SINGLE_PROCESS = ("one_device", "mirrored", "central_storage", "tpu")


@dataclass(frozen=True)
class Topology:
    accelerator: str = "auto"   # auto | cpu | gpu | tpu
    num_workers: int = 1
    devices_per_worker: int = 0  # 0 = all visible
    num_ps: int = 0
    tpu_address: str = ""
    tpu_zone: str = ""
    tpu_project: str = ""

    @classmethod
    def from_config(cls, cfg) -> "Topology":
        return cls(accelerator=cfg.accelerator, num_workers=cfg.num_workers,
                   devices_per_worker=cfg.devices_per_worker, num_ps=cfg.num_ps,
                   tpu_address=cfg.tpu_address, tpu_zone=cfg.tpu_zone,
                   tpu_project=cfg.tpu_project)

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_strategy_name(topology: Topology, requested: str = "auto",
                          visible_devices: int | None = None) -> str:
    """Map a topology to a strategy name, or raise ConfigError naming the conflicting field.

    `visible_devices` is the number of accelerators (or logical CPU devices) one worker sees;
    None when unknown (the controller), in which case `auto` on one worker resolves to
    "mirrored" only if devices_per_worker asks for several.
    """
    t = topology
    devices = t.devices_per_worker or visible_devices or 1
    wants_tpu = t.accelerator == "tpu" or bool(t.tpu_address)

    if requested == "auto":
        if wants_tpu:
            requested = "tpu"
        elif t.num_ps > 0:
            requested = "parameter_server"
        elif t.num_workers > 1:
            requested = "multi_worker_mirrored"
        elif devices > 1:
            requested = "mirrored"
        else:
            requested = "one_device"

    if requested == "tpu":
        if t.accelerator not in ("auto", "tpu"):
            raise ConfigError("accelerator", f"strategy tpu needs accelerator tpu or auto, "
                                             f"not {t.accelerator}")
        if not t.tpu_address:
            raise ConfigError("tpu_address", "strategy tpu needs the TPU name, a grpc:// "
                                             "address, or 'local' on a TPU VM")
    elif wants_tpu:
        raise ConfigError("strategy", f"{requested} cannot drive a TPU; use tpu or auto")
    if requested in ("one_device", "mirrored", "central_storage", "tpu") and t.num_workers != 1:
        raise ConfigError("num_workers", f"strategy {requested} runs in one process; set "
                                         f"num_workers to 1 or use multi_worker_mirrored")
    if requested == "parameter_server" and t.num_ps < 1:
        raise ConfigError("num_ps", "strategy parameter_server needs at least 1 parameter "
                                    "server")
    if requested != "parameter_server" and t.num_ps > 0:
        raise ConfigError("num_ps", f"parameter servers are only used by parameter_server, "
                                    f"not {requested}")
    if requested == "one_device" and t.devices_per_worker > 1:
        raise ConfigError("devices_per_worker", "one_device uses a single device; set it "
                                                "to 0 or 1, or use mirrored")
    return requested


def cluster_shape(strategy_name: str, topology: Topology) -> dict[str, int]:
    """Processes per TF_CONFIG role. Empty for single-process strategies (no TF_CONFIG)."""
    if strategy_name in SINGLE_PROCESS:
        return {}
    if strategy_name == "multi_worker_mirrored":
        return {"worker": topology.num_workers}  # worker 0 acts as chief
    if strategy_name == "parameter_server":
        return {"chief": 1, "worker": topology.num_workers, "ps": topology.num_ps}
    raise ConfigError("strategy", f"unknown strategy {strategy_name}")


def _tf_config(environ) -> tuple[dict, str, int]:
    """TF_CONFIG's (cluster, this task's type, its index); ({}, "chief", 0) without one."""
    config = json.loads(environ.get("TF_CONFIG") or "{}")
    task = config.get("task") or {}
    return config.get("cluster") or {}, task.get("type", "chief"), int(task.get("index", 0))


def cluster_task(environ=os.environ) -> tuple[str, int, int]:
    """This process's (task type, index, processes of that type) from TF_CONFIG; ("chief",
    0, 1) without a cluster."""
    cluster, role, index = _tf_config(environ)
    return role, index, len(cluster.get(role) or ()) or 1


def worker_position(environ=os.environ) -> tuple[int, int]:
    """(position, count) of this process among the cluster's chief and worker tasks, chief
    first; (0, 1) without a cluster. Independent workers (batch scoring) split their work by
    it: Vertex AI runs worker 0 of a workers-only cluster as its pool-0 task "chief", so the
    TF_CONFIG index alone would make it and worker 1 both "worker 0 of 1"."""
    cluster, role, index = _tf_config(environ)
    chiefs = len(cluster.get("chief") or ())
    position = index + (chiefs if role == "worker" else 0)
    return position, (chiefs + len(cluster.get("worker") or ())) or 1
