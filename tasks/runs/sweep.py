"""A sweep: trials of one base config over a search space, sharing the data and tokenize steps.

Layout (the sweep and each trial are run folders, so the run page, the compare page and the
steps work on them unchanged):
    {root}/runs/{dag_id}/{key}/                 the sweep: config.json (the shared config),
        data/, sweep.json, best/manifest.json   the data step, the plan, the chosen trial
    {root}/runs/{dag_id}/{key}__trial-01/       trial 1: config.json (base | its values),
        data/manifest.json                      the sweep's, copied
        tokenize/ train/ evaluate/ ...          tokenize run by one trial per max_seq_length,
                                                its manifest copied to the others

Every trial's config is validated whole (`parse_config(base | values)`) before any compute,
and an error names the trial. Fields that every trial gets the same value of belong to the
shared config, so a sweep over one value runs exactly the plain bert_finetune run of that
config; the data split always uses the shared config (its `seed` unless every trial has
another), so every trial is evaluated on the same rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.config import DEFAULT_VALIDATION_FRACTION, RunConfig, parse_config
from tasks.params_form import SECTIONS

from tasks.io.uris import join_uri
from tasks.errors import BertflowError, ConfigError
from tasks.io import storage
from tasks.runs import runlayout, sweep_space
from tasks.runs.pruning import RULES
from tasks.runs.runlayout import RunContext

SWEEP_FILE = "sweep.json"
# What a trial may vary: how it trains, not what it trains on, from which checkpoint, where it
# runs or where its model goes (every trial shares the data, the tokenizer, the workers'
# backend and the export location).
SWEEPABLE = frozenset(SECTIONS["Training"] + SECTIONS["Training (advanced)"]
                      + ("epochs", "seed", "max_seq_length")) - {"evaluate_in_train"}


@dataclass(frozen=True)
class Trial:
    index: int  # 1-based, as the folders and labels count
    values: dict[str, Any]
    cfg: RunConfig

    @property
    def label(self) -> str:
        return sweep_space.label(self.values)


@dataclass(frozen=True)
class Plan:
    shared: RunConfig
    trials: list[Trial]
    space: dict
    pruning: str = "none"  # tasks/runs/pruning.py


def plan(values: dict[str, Any], space: Any, pruning: str = "none") -> Plan:
    """The trials of `space` over the base `values` (Params), each config checked whole;
    ConfigError names the search-space entry or the trial and field.

    Trials are ranked on validation rows (held out of train unless validation_uri is given)
    and never read the test rows: they do not evaluate after training (evaluate_in_train
    off); the sweep evaluates its best trial on test, once. `pruning` (sweep_pruning) needs
    evaluation during training in every trial."""
    if pruning not in RULES:
        raise ConfigError("sweep_pruning", f"{pruning!r} is not one of {', '.join(RULES)}")
    for kind in ("grid", "random"):
        dims = space.get(kind) if isinstance(space, dict) else None
        for name in dims if isinstance(dims, dict) else ():
            if name not in SWEEPABLE:
                raise ConfigError(f"search_space.{kind}.{name}",
                                  "not sweepable: every trial shares the data, checkpoint, "
                                  f"backend and export; sweep one of {sorted(SWEEPABLE)}")
    if not values.get("validation_uri") and values.get("validation_fraction") in (None, ""):
        # Trials are ranked on validation rows, never on the test rows the gate reads.
        values = {**values, "validation_fraction": DEFAULT_VALIDATION_FRACTION}
    values = {**values, "evaluate_in_train": False}
    overrides = sweep_space.trials(space)
    trials = []
    for index, override in enumerate(overrides, start=1):
        try:
            cfg = parse_config({**values, **override})
        except ConfigError as err:
            raise ConfigError(err.field, f"trial {index} ({sweep_space.label(override)}): "
                                         f"{err.reason}") from None
        if pruning != "none" and not cfg.validates_in_train:
            raise ConfigError("sweep_pruning", f"{pruning} pruning compares the trials' "
                                               "evaluations during training: set "
                                               "eval_every_steps or eval_every_epoch (trial "
                                               f"{index} has neither), or sweep_pruning none")
        trials.append(Trial(index, override, cfg))
    common = {name: overrides[0][name] for name in overrides[0]
              if all(trial.get(name) == overrides[0][name] for trial in overrides)}
    return Plan(parse_config({**values, **common}), trials, space, pruning)


def trial_context(sweep: RunContext, index: int) -> RunContext:
    return RunContext(sweep.artifact_root, sweep.dag_id, f"{sweep.run_key}__trial-{index:02d}",
                      sweep.run_id, sweep.experiment, sweep.logical_date)


def init_sweep(p: Plan, ctx: RunContext, max_parallel_trials: int) -> dict[str, Any]:
    """Write the sweep's folder and every trial's; returns what the DAG maps over."""
    runlayout.init_run(p.shared, ctx)
    trials = []
    for trial in p.trials:
        tctx = trial_context(ctx, trial.index)
        runlayout.init_run(trial.cfg, tctx)
        trials.append({"index": trial.index, "label": trial.label, "values": trial.values,
                       "run_uri": tctx.run_uri, "run_key": tctx.run_key,
                       "max_seq_length": trial.cfg.max_seq_length})
    record = {"space": p.space, "max_parallel_trials": max_parallel_trials,
              "metric": p.shared.gate_metric_name, "pruning": p.pruning, "trials": trials}
    storage.write_json(join_uri(ctx.run_uri, SWEEP_FILE), record)
    return {"sweep_uri": ctx.run_uri,
            "trials": [{"run_uri": t["run_uri"], "label": t["label"]} for t in trials]}


def read_sweep(sweep_uri: str) -> dict[str, Any]:
    return storage.read_json(join_uri(sweep_uri, SWEEP_FILE))


def _copy_manifest(step: str, source_run: str, target_run: str) -> None:
    storage.write_bytes(join_uri(target_run, step, runlayout.MANIFEST),
                        storage.read_bytes(join_uri(source_run, step, runlayout.MANIFEST)))


def share_data(sweep_uri: str) -> list[dict[str, str]]:
    """Give every trial the sweep's data manifest; returns one trial per distinct
    max_seq_length (the one that tokenizes for its group), labelled for the UI."""
    record = read_sweep(sweep_uri)
    for trial in record["trials"]:
        _copy_manifest("data", sweep_uri, trial["run_uri"])
    return [{"run_uri": lead["run_uri"], "label": f"max_seq_length={length}"}
            for length, lead in _leads(record).items()]


def share_tokens(sweep_uri: str) -> list[dict[str, str]]:
    """Give every trial its group's tokenize manifest; returns the trials to map over."""
    record = read_sweep(sweep_uri)
    leads = _leads(record)
    for trial in record["trials"]:
        lead = leads[trial["max_seq_length"]]
        if lead["run_uri"] != trial["run_uri"]:
            _copy_manifest("tokenize", lead["run_uri"], trial["run_uri"])
    return [{"run_uri": t["run_uri"], "label": t["label"]} for t in record["trials"]]


def _leads(record: dict) -> dict[int, dict]:
    """The first trial of each distinct max_seq_length, in trial order."""
    leads: dict[int, dict] = {}
    for trial in record["trials"]:
        leads.setdefault(trial["max_seq_length"], trial)
    return leads


def may_start(index: int, finished_before: int, max_parallel: int) -> bool:
    """Trial `index` (1-based) may start once fewer than max_parallel of the trials before it
    are unfinished (`finished_before` of the index - 1 before it have ended, whether they ran,
    failed or never started). Then at most max_parallel trials run at once: the running trial
    with the highest index m saw at most max_parallel - 1 unfinished trials before it when it
    started, only those can still be running beside it, and a trial ends only once. Trials
    start in order, and none waits for a later one, so the wait always ends."""
    return (index - 1) - finished_before < max_parallel


def pick_best(sweep_uri: str) -> dict[str, Any]:
    """The trial whose saved weights validate best on the gate metric (the train manifest's
    `validation.exported_value`; ties: the lower index) among those that trained to their
    end, early stopping included; pruned trials never win. Writes `best/manifest.json` with
    every trial's outcome. BertflowError when no trial can be ranked."""
    record = read_sweep(sweep_uri)
    metric = record["metric"]
    rows = []
    for trial in record["trials"]:
        uri = join_uri(trial["run_uri"], "train", runlayout.MANIFEST)
        trained = storage.read_json(uri) if storage.exists(uri) else {}
        validated = trained.get("validation") or {}
        value = validated.get("exported_value")
        rows.append({"index": trial["index"], "label": trial["label"],
                     "run_uri": trial["run_uri"], "run_key": trial["run_key"],
                     "trained": bool(trained), "validation": value,
                     "best_step": validated.get("best_step"),
                     "stopped_early": bool(validated.get("stopped_early")),
                     "pruned": validated.get("pruned"),
                     "ranked": value is not None and not validated.get("pruned")})
    ranked = [r for r in rows if r["ranked"]]
    if not ranked:
        raise BertflowError(f"no trial of the sweep {sweep_uri} trained to its end with a "
                            "validation figure; see the trials' train task logs")
    best = max(ranked, key=lambda r: (r["validation"], -r["index"]))
    manifest = {"metric": metric, "ranked_on": "validation", "best": best, "trials": rows}
    runlayout.write_manifest(join_uri(sweep_uri, "best"), manifest)
    return manifest
