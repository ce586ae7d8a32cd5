"""validate's memory check: the workers' memory as the controller knows it from the config
(this machine for local workers, worker_memory for Kubernetes pods), against the estimate of
tasks/training/memory.py. Here, not in tasks/training/, because it runs only in the Airflow
task: it may use the Kubernetes client, which worker images need not carry."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from tasks.errors import ConfigError
from tasks.training.memory import BertShape, Estimate, check_fits, worker_memory


def budget_for_validate(cfg, environ=os.environ) -> tuple[Optional[int], str, int]:
    """(bytes per worker, source, processes sharing them) the validate task can know, or
    (None, reason, 1): CPU workers only (accelerator memory is not host memory)."""
    if cfg.accelerator in ("gpu", "tpu") or cfg.tpu_address or cfg.accelerator_type:
        return None, "accelerator memory is not estimated", 1
    if cfg.provisioner == "local":
        if cfg.accelerator == "auto" and Path("/dev/nvidia0").exists():
            return None, "workers may train on this machine's GPU", 1
        budget, source = worker_memory(environ)
        return budget, source, cfg.num_workers  # local workers share this machine
    if cfg.provisioner == "kubernetes" and cfg.worker_memory:
        # The official client's parser of Kubernetes quantities (16Gi, 1600M, ...).
        from kubernetes.utils import parse_quantity

        try:
            return int(parse_quantity(cfg.worker_memory)), "worker_memory", 1
        except ValueError:
            raise ConfigError("worker_memory", f"{cfg.worker_memory!r} is not a Kubernetes "
                                               f"memory quantity such as 16Gi") from None
    return None, "the workers' memory is known only on them (train checks it)", 1


def check_config(cfg, config_json: Optional[Path], environ=os.environ) -> Optional[Estimate]:
    """validate's check: cheap (config.json only); None when the memory is not known here."""
    if config_json is None or not Path(config_json).is_file():
        return None
    budget, source, sharing = budget_for_validate(cfg, environ)
    if budget is None:
        return None
    replicas = max(cfg.devices_per_worker, 1)
    num_labels = len(cfg.labels) if cfg.labels else 2
    bfloat16 = {"none": False, "mixed_float16": True, "mixed_bfloat16": True}.get(
        cfg.mixed_precision)  # 16-bit compute either way; auto: the worker's CPU decides
    return check_fits(cfg, BertShape.from_file(config_json), budget, source, bfloat16=bfloat16,
                      replicas=replicas, num_labels=num_labels, sharing=sharing)
