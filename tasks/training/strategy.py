"""Build the tf.distribute strategy a worker process trains and evaluates under.

The name comes from `tasks.topology.resolve_strategy_name` (shared with the controller), fed
with the devices this process really sees. Multi-process strategies read the cluster from
TF_CONFIG, which the provisioner sets per process.
"""
from __future__ import annotations

import json
import os
import time

import tensorflow as tf

from tasks.errors import BertflowError
from tasks.topology import Topology, cluster_task, resolve_strategy_name


def task_role() -> tuple[str, int]:
    """This process's (task type, index) from TF_CONFIG; ("chief", 0) without a cluster."""
    role, index, _ = cluster_task()
    return role, index


def is_chief() -> bool:
    """The one process that writes outputs: the PS chief, MWMS worker 0, or a lone process."""
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
    task_type, index = task_role()
    if "chief" in cluster or not cluster:
        return task_type == "chief"
    return task_type == "worker" and index == 0


def is_server_task(name: str) -> bool:
    """Under parameter_server only the chief runs the step's code; workers and ps serve it."""
    return name == "parameter_server" and task_role()[0] in ("worker", "ps")


def serve_forever(stop=None) -> None:
    """Run this process's tf.distribute.Server for the chief to use; never returns (the
    provisioner stops ps/worker processes once the chief has finished). `stop()`, polled,
    may end the process (a preemption notice): waiting in Python, not in server.join(),
    lets signal handlers run."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # Started on construction; held so that it is not collected while this process serves.
    _server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"serving as {resolver.task_type} {resolver.task_id}", flush=True)
    while not (stop is not None and stop()):
        time.sleep(0.2)


def strategy_name(cfg) -> str:
    """The strategy this process uses; configures logical CPU devices first if asked to."""
    topology = Topology.from_config(cfg)
    visible = _prepare_devices(cfg) if not (cfg.accelerator == "tpu" or cfg.tpu_address) else None
    return resolve_strategy_name(topology, cfg.strategy, visible)


def build_strategy(cfg) -> tuple[tf.distribute.Strategy, str]:
    """(strategy, name) for this process. Must run before TensorFlow executes anything, as
    logical devices can only be configured before the runtime starts."""
    name = strategy_name(cfg)
    # Listing logical devices starts the runtime, which multi-worker strategies must
    # configure first: only the single-process ones pick their devices here.
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(_local_devices(cfg)[0]), name
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(_local_devices(cfg)), name
    if name == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy(_local_devices(cfg)), name
    if name == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=_cluster(name)), name
    if name == "parameter_server":
        if is_server_task(name):
            raise BertflowError("parameter_server workers and ps serve the chief: call "
                                "serve_forever() instead of building a strategy")
        return tf.distribute.experimental.ParameterServerStrategy(_cluster(name)), name
    if name == "tpu":
        return tf.distribute.TPUStrategy(_connect_tpu(cfg)), name
    raise BertflowError(f"strategy {name}: not supported")


def in_cluster() -> bool:
    """Whether this process is one task of a TF_CONFIG cluster."""
    return bool(json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster"))


def local_strategy(cfg) -> tuple[tf.distribute.Strategy, str]:
    """(strategy, name) over this process's own devices, for a step the configured cluster
    strategy does not run (a sweep's best trial evaluated alone): Mirrored over its devices,
    or one device."""
    devices = _local_devices(cfg)
    if len(devices) > 1:
        return tf.distribute.MirroredStrategy(devices), "mirrored"
    return tf.distribute.OneDeviceStrategy(devices[0]), "one_device"


def device_kind(cfg, name: str) -> str:
    """"tpu", "gpu" or "cpu": what the replicas of this process compute on."""
    if name == "tpu":
        return "tpu"
    return "gpu" if tf.config.list_physical_devices("GPU") and cfg.accelerator != "cpu" else "cpu"


def use_cpu_kernels(kind: str, name: str) -> bool:
    """Whether this process trains on bertflow's CPU kernels (tasks/model/cpu_kernels): on CPU
    replicas, when the library is built. Not under ParameterServer, whose variables are
    updated inside the ps servers, which load no op library."""
    from tasks.model import cpu_kernels
    return kind == "cpu" and name != "parameter_server" and cpu_kernels.available()


def _prepare_devices(cfg) -> int:
    """Number of devices one worker trains on. On CPU, devices_per_worker > 1 splits the CPU
    into that many logical devices so Mirrored can be exercised without GPUs."""
    gpus = tf.config.list_physical_devices("GPU")
    if cfg.accelerator == "gpu" and not gpus:
        raise BertflowError("accelerator is gpu but this worker sees no GPU; set accelerator "
                            "to auto or cpu, or run on a GPU machine")
    if gpus and cfg.accelerator != "cpu":
        return min(cfg.devices_per_worker or len(gpus), len(gpus))
    wanted = max(cfg.devices_per_worker, 1)
    cpu = tf.config.list_physical_devices("CPU")[0]
    if wanted > 1:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
        except RuntimeError:  # runtime already started: fine if it was split the same way
            if len(tf.config.list_logical_devices("CPU")) != wanted:
                raise BertflowError(
                    f"devices_per_worker={wanted} on CPU needs the strategy built before "
                    f"TensorFlow runs anything in this process") from None
    return wanted


def _local_devices(cfg) -> list[str]:
    if device_kind(cfg, "") == "gpu":
        gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
        return gpus[:cfg.devices_per_worker or len(gpus)]
    return [d.name for d in tf.config.list_logical_devices("CPU")][:max(cfg.devices_per_worker, 1)]


def _cluster(name: str) -> tf.distribute.cluster_resolver.ClusterResolver:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not resolver.cluster_spec().as_dict():
        raise BertflowError(f"strategy {name} needs TF_CONFIG describing the cluster; run "
                            f"workers through the provisioner, or set num_workers to 1")
    return resolver


def _connect_tpu(cfg) -> tf.distribute.cluster_resolver.TPUClusterResolver:
    where = f"TPU '{cfg.tpu_address}'" + (f" in zone {cfg.tpu_zone}" if cfg.tpu_zone else "")
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=cfg.tpu_address, zone=cfg.tpu_zone or None, project=cfg.tpu_project or None)
        if cfg.tpu_address != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as err:
        raise BertflowError(
            f"cannot reach {where} ({str(err).splitlines()[0][:200]}). Set the tpu_address "
            f"Param to the TPU name or grpc:// address (and tpu_zone / tpu_project if it is "
            f"not in this VM's zone and project), or 'local' on a TPU VM") from None
    return resolver


def any_worker(strategy, name: str):
    """A function of a flag returning whether any worker passed True: the same answer on
    every worker of multi_worker_mirrored (a summing collective; every worker must call it at
    the same point), the process's own flag under the single-process strategies and
    parameter_server (whose chief alone decides)."""
    if name != "multi_worker_mirrored":
        return bool

    @tf.function
    def summed(flag):
        per_replica = strategy.run(lambda: tf.identity(flag))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return lambda flag: bool(summed(tf.constant(1.0 if flag else 0.0)) > 0)
