"""What a run checks before any compute: the DAG's validate task (bertflow_airflow/run_tasks.py,
`checked_run`) and the command line (`python -m tasks init-run`, `python -m tasks validate`)
call the same functions, so a config that the DAG refuses is refused on the command line too,
with the same message.

- `check_inputs_and_model(cfg)`: the data files, the checkpoint (exists, has the files
  loading needs, is a BERT; a champion is pinned to its version; its tokenizer's casing
  against lower_case), the batch against the workers' memory, the capacity the backend can
  express. Sets cfg.base_model to the pinned checkpoint every step then starts from, and an
  empty lower_case to the checkpoint's. No run folder needed.
- `check_backend(cfg, ctx)`: the backend's own checks (e.g. remote workers need a gs:// or
  s3:// run folder), then a gated Hub checkpoint staged for workers that get no connections.
- `check_run(cfg, ctx)`: both, in that order.

Imports no Airflow; the heavy parts (the data reader, the checkpoint checks) are imported when
called.
"""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.runs.runlayout import RunContext


def check_inputs_and_model(cfg: RunConfig) -> RunConfig:
    from tasks.io import storage
    from tasks.model import casing
    from tasks.provision import capacity, memory_budget
    from tasks.steps import data
    from tasks.training import checkpoint_sources, memory

    storage.configure(storage.Connections(cfg.gcp_conn_id, cfg.aws_conn_id))
    data.check_inputs(cfg)
    # Exists, has the files loading needs, is a BERT (config.json and a listing only);
    # a champion is pinned to its version, so every step starts from the same weights.
    cfg.base_model = checkpoint_sources.check(cfg)
    # The tokenizer's casing, from the checkpoint: a contradicting lower_case is refused here,
    # and an empty one is pinned for the data and tokenize steps.
    found = checkpoint_sources.casing(cfg)
    if found is not None:
        cfg.lower_case = casing.decide(cfg.lower_case, cfg.lower_case_override, found).lower_case
    # A batch that would not fit the workers' memory, from the checkpoint's config.json.
    config_json = memory.readable_config(cfg)
    memory_budget.check_config(cfg, config_json)
    _check_freeze(cfg, config_json)
    capacity.check(cfg)  # e.g. flex-start on a GPU type Dynamic Workload Scheduler lacks
    return cfg


def _check_freeze(cfg: RunConfig, config_json) -> None:
    """freeze deeper than the model, where its config.json can be read here (else the train
    step refuses it before training)."""
    from tasks.errors import ConfigError
    from tasks.model.config import EncoderConfig

    layers = cfg.frozen_layers[1]
    if layers and config_json is not None:
        depth = EncoderConfig.from_pretrained(config_json.parent).num_layers
        if layers > depth:
            raise ConfigError("freeze", f"{cfg.freeze}: the checkpoint has {depth} layers; "
                                        f"freeze at most embeddings+{depth}")


def check_backend(cfg: RunConfig, ctx: RunContext) -> RunConfig:
    from tasks.provision.backends import backend_for
    from tasks.training import hub_staging

    backend = backend_for(cfg)
    backend.check(cfg, ctx)  # e.g. remote workers need a gs:// or s3:// run folder
    if not backend.receives_connections:  # a gated Hub repo: the token stays here
        cfg.base_model = hub_staging.stage_for_workers(cfg)
    return cfg


def check_run(cfg: RunConfig, ctx: RunContext) -> RunConfig:
    return check_backend(check_inputs_and_model(cfg), ctx)
