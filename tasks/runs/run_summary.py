"""Read-only summaries of run folders and model versions, for the bertflow page (plugins/).

Pure Python over `tasks.io.storage` (local, gs://, s3://), no TensorFlow. Everything is read
from fixed names inside a run or version folder found by listing the artifact root or an
export location; URIs recorded inside manifests are never followed, and names coming from a
request are checked with `valid_name` and against the listing before they become part of a
URI.

Export locations: models go to `{export_uri}/{model_name}/{version}/`, where `export_uri`
(RunConfig.resolved_export_uri, possibly templated per run) defaults to `{root}/models`. The
known locations are that default plus every distinct resolved `export_uri` the runs under
the root recorded in their config.json. A request names a location only by its
`location_id` (a hash of the URI), looked up in that server-side set; never by a path.

Sweeps (tasks/runs/sweep.py): a sweep folder `{run_key}/` holds sweep.json (the plan) and
best/manifest.json (the chosen trial); each trial is a run folder `{run_key}__trial-NN/`
named in sweep.json. The experiments table nests a sweep's trials under it, labels each trial
by its searched values and gives the sweep's row its best trial's figures; a sweep's page
shows its best trial's training, evaluation, exported version and gate.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from tasks import task_kinds
from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.errors import StorageError
from tasks.runs.runlayout import CHAMPION

# bert_batch_score's runs score with a version and train nothing: listed apart (scoring_runs),
# not among the experiments. Its folders: {run}/score/plan.json (validate) and
# {run}/score/summary.json (publish; tasks/scoring/publish.py).
SCORING_DAG = "bert_batch_score"
LOCATION_ID = re.compile(r"[0-9a-f]{16}")  # location_id(): what a request may name
# dag ids, run keys (runlayout.run_key_for keeps [A-Za-z0-9._-]), model names and versions.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,249}")
HISTORY = "history.json"    # train/history.json, written by tasks.steps.train.Progress
SWEEP_FILE = "sweep.json"   # tasks.runs.sweep.SWEEP_FILE: a sweep folder's plan
TRIAL_KEY = re.compile(r"(?P<sweep>.+)__trial-(?P<index>\d+)")  # sweep.trial_context's names
# What a sweep's row in the experiments table takes from its best trial: the trial's config,
# figures and exported version (the sweep folder itself trains nothing).
FROM_BEST = ("learning_rate", "epochs", "per_replica_batch_size", "global_batch_size",
             "max_seq_length", "strategy", "provisioner", "accuracy", "macro_f1",
             "train_seconds", "examples_per_second", "steps", "goodput", "model_name",
             "version", "export_location", "export_location_id", "promoted", "promote_reason")
# Worker log files (tasks/provision/worker_logs.py): {run}/{step}/logs/{role}-{index}.log,
# the newest attempt's, and {role}-{index}.attempt-{n}.log, each provisioning attempt's own.
LOG_STEPS = ("data", "tokenize", "train", "evaluate", "export", "gate_eval")
LOG_NAME = re.compile(r"(?P<worker>(chief|worker|ps|evaluator)-\d{1,5})"
                      r"(\.attempt-(?P<attempt>\d{1,5}))?\.log")


def valid_name(name: str) -> bool:
    """One path segment of a safe shape: no separators, no dot-only or '..' parts."""
    return bool(NAME.fullmatch(name)) and ".." not in name


def read_json_or_none(uri: str) -> Any:
    try:
        return storage.read_json(uri)
    except (StorageError, ValueError):
        return None


def _dict(uri: str) -> dict[str, Any]:
    """A JSON object file's content; {} when it is missing, unreadable or not an object."""
    value = read_json_or_none(uri)
    return value if isinstance(value, dict) else {}


def _folders_with(prefix: str, name: str, depth: int) -> list[tuple[str, ...]]:
    """The `depth` path parts under `prefix` of every folder holding a file `name`."""
    return _folders_with_any(prefix, (name,), depth)[name]


def _folders_with_any(prefix: str, names: tuple[str, ...],
                      depth: int) -> dict[str, list[tuple[str, ...]]]:
    """_folders_with for several file names, from one listing of `prefix`."""
    base = prefix.rstrip("/") + "/"
    out: dict[str, set] = {name: set() for name in names}
    for uri in storage.list_uris(prefix):
        if not uri.startswith(base):
            continue
        *parts, name = uri[len(base):].split("/")
        if name in out and len(parts) == depth and all(valid_name(p) for p in parts):
            out[name].add(tuple(parts))
    return {name: sorted(found) for name, found in out.items()}


def runs_uri(root: str) -> str:
    return join_uri(root, "runs")


def models_uri(root: str) -> str:
    return join_uri(root, "models")


def list_runs(root: str) -> list[tuple[str, str]]:
    """(dag_id, run_key) of every run folder (one with a context.json) under `root`."""
    return _folders_with(runs_uri(root), "context.json", 2)


def list_runs_and_sweeps(root: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(run folders, the folders among them and others that hold a sweep.json), from one
    listing of the runs."""
    found = _folders_with_any(runs_uri(root), ("context.json", SWEEP_FILE), 2)
    return found["context.json"], found[SWEEP_FILE]


def list_versions(root: str) -> list[tuple[str, str]]:
    """(model_name, version) of every completely published version under {root}/models."""
    return list_versions_at(models_uri(root))


def list_versions_at(location: str) -> list[tuple[str, str]]:
    """(model_name, version) of every completely published version under an export
    location (`{location}/{model_name}/{version}/_COMPLETE.json`)."""
    return _folders_with(location, storage.COMPLETE, 2)


# --- export locations ------------------------------------------------------------------------

def location_id(location: str) -> str:
    """The name a page link gives an export location: a hash of its URI, never the URI."""
    return hashlib.sha256(location.encode()).hexdigest()[:16]


def normalized_location(uri: Any) -> str | None:
    """An export URI as a location (no trailing slash; local paths absolute and normalised,
    without file://); None for what cannot be one: not a string, an unsupported or
    credential-bearing URI, a relative local path (relative to which process's folder?), the
    filesystem root or a URI without a bucket."""
    if not isinstance(uri, str) or not uri.strip():
        return None
    try:
        scheme = storage.scheme_of(uri)
    except StorageError:
        return None
    if scheme == "file":
        path = str(storage.local_path(uri))
        if not os.path.isabs(path):
            return None
        return os.path.normpath(path).rstrip("/") or None
    location = uri.rstrip("/")
    return location if location.split("://", 1)[1].split("/", 1)[0] else None


def default_location(root: str) -> str:
    """{root}/models: where a run without export_uri exports."""
    return normalized_location(models_uri(root)) or models_uri(root)


def run_export_location(root: str, config: dict[str, Any]) -> str | None:
    """The resolved export URI a run recorded in its config.json
    (RunConfig.resolved_export_uri; the page's root stands for the run's artifact root, as
    the run folder was found under it); None when the recorded value is unusable."""
    recorded = config.get("export_uri")
    if recorded in (None, ""):
        return default_location(root)
    return normalized_location(recorded)


def export_locations(root: str, rows: list[dict[str, Any]] | None = None) -> list[str]:
    """The default location first, then the other distinct export locations the runs under
    `root` recorded, sorted. `rows`: run summaries already read (else config.json of every
    run is read)."""
    if rows is None:
        found = {run_export_location(root, _dict(join_uri(runs_uri(root), d, k, "config.json")))
                 for d, k in list_runs(root)}
    else:
        found = {r["export_location"] for r in rows}
    default = default_location(root)
    return [default] + sorted(loc for loc in found if loc and loc != default)


def locations_by_id(root: str) -> dict[str, str]:
    """location_id -> location for every known export location."""
    return {location_id(loc): loc for loc in export_locations(root)}


def _headline(config: dict, evaluation: dict, metrics: dict) -> tuple[str, Any] | None:
    """(name, value) of the run's gate metric: gate_metric, or for auto its task's first."""
    kind = task_kinds.KINDS.get(evaluation.get("task") or config.get("task") or "")
    name = config.get("gate_metric")
    if name in (None, "auto") and kind is not None:
        name = kind.gate_metrics[0]
    return (name, metrics[name]) if name in metrics else None


def run_summary(root: str, dag_id: str, run_key: str) -> dict[str, Any]:
    """One row of the experiments table: context, key config, training and evaluation
    figures of a run folder (None for what a step has not written yet)."""
    run = join_uri(runs_uri(root), dag_id, run_key)
    context = _dict(join_uri(run, "context.json"))
    config = _dict(join_uri(run, "config.json"))
    train = _dict(join_uri(run, "train", "manifest.json"))
    evaluation = _dict(join_uri(run, "evaluate", "manifest.json"))
    export = _dict(join_uri(run, "export", "manifest.json"))
    promote = _dict(join_uri(run, "promote", "manifest.json"))
    metrics = evaluation.get("metrics") or {}
    location = run_export_location(root, config)
    measured = train_goodput(run)
    return {
        "dag_id": dag_id, "run_key": run_key, "uri": run,
        "experiment": context.get("experiment") or config.get("experiment") or "default",
        "logical_date": context.get("logical_date") or "",
        "run_id": context.get("run_id") or "",
        "date": context.get("logical_date") or context.get("run_id") or run_key,
        "learning_rate": config.get("learning_rate"),
        "epochs": config.get("epochs"),
        "per_replica_batch_size": config.get("per_replica_batch_size"),
        "global_batch_size": train.get("global_batch_size"),
        "max_seq_length": config.get("max_seq_length"),
        "strategy": train.get("strategy") or config.get("strategy"),
        "provisioner": config.get("provisioner"),
        "accuracy": metrics.get("accuracy"),
        "macro_f1": metrics.get("macro_f1"),
        # Multi-label and regression runs: the task and its gate metric, shown where
        # accuracy is for classification.
        "task": evaluation.get("task") or "classification",
        "headline": None if "accuracy" in metrics else _headline(config, evaluation, metrics),
        "train_seconds": train.get("train_seconds"),
        "examples_per_second": train.get("examples_per_second"),
        "steps": train.get("steps"),
        "goodput": measured["goodput"] if measured else None,
        "model_name": export.get("model_name"),
        "version": export.get("version"),
        "export_location": location,
        "export_location_id": location_id(location) if location else None,
        "promoted": promote.get("promoted"),
        "promote_reason": promote.get("reason"),
        # A plain run until experiments() finds it is a sweep or one of a sweep's trials.
        "kind": "run",
        "label": context.get("logical_date") or context.get("run_id") or run_key,
        "sweep_key": None, "trial_index": None, "best_trial": False,
        "trials": None, "best_key": None, "best_label": None, "best_index": None,
    }


def experiments(root: str) -> dict[str, list[dict[str, Any]]]:
    """Run summaries grouped by experiment (sorted by name), newest date first in a group.
    A sweep's row has `kind` "sweep", its trial count and its best trial's figures
    (FROM_BEST; `best_key`, `best_label`, `best_index`); its trials' rows have `kind`
    "trial", `sweep_key`, `trial_index`, `label` (their searched values) and sit in the
    sweep's experiment."""
    runs, sweeps = list_runs_and_sweeps(root)
    rows = {(dag_id, run_key): run_summary(root, dag_id, run_key) for dag_id, run_key in runs
            if dag_id != SCORING_DAG}
    for dag_id, run_key in sweeps:
        row = rows.get((dag_id, run_key))
        record = read_sweep(root, dag_id, run_key) if row else None
        if record is None:
            continue
        for trial in record["trials"]:
            found = rows.get((dag_id, trial["run_key"]))
            if found is not None and found is not row and found["kind"] == "run":
                found.update(kind="trial", sweep_key=run_key, trial_index=trial["index"],
                             label=trial["label"], experiment=row["experiment"],
                             best_trial=trial["run_key"] == record["best"])
        row.update(kind="sweep", trials=len(record["trials"]), best_key=record["best"])
        best = rows.get((dag_id, record["best"])) if record["best"] else None
        if best is not None and best is not row:
            row.update({field: best[field] for field in FROM_BEST})
            chosen = next(t for t in record["trials"] if t["run_key"] == record["best"])
            row.update(best_label=chosen["label"], best_index=chosen["index"])
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows.values():
        groups.setdefault(row["experiment"], []).append(row)
    for rows in groups.values():
        rows.sort(key=lambda r: str(r["date"]), reverse=True)
    return dict(sorted(groups.items()))


def scoring_runs(root: str) -> list[dict[str, Any]]:
    """bert_batch_score's runs, newest first: the model version, rows, unreadable rows,
    rows per second and the output of each published one; the version and the planned rows of
    one not (yet) published."""
    out = []
    for dag_id, run_key in list_runs(root):
        if dag_id != SCORING_DAG:
            continue
        run = join_uri(runs_uri(root), dag_id, run_key)
        summary = _dict(join_uri(run, "score", "summary.json"))
        plan = {} if summary else _dict(join_uri(run, "score", "plan.json"))
        context = _dict(join_uri(run, "context.json"))
        model = plan.get("model") if isinstance(plan.get("model"), dict) else {}
        out.append({
            "run_key": run_key, "run_id": context.get("run_id") or run_key,
            "published": bool(summary),
            "model_version": summary.get("model_version") or model.get("version"),
            "task": summary.get("task") or model.get("task"),
            "rows": summary.get("rows") if summary else plan.get("rows"),
            "error_rows": summary.get("error_rows"), "workers": summary.get("workers"),
            "seconds": summary.get("seconds"),
            "rows_per_second": summary.get("rows_per_second"),
            "output_uri": summary.get("output_uri") or plan.get("output_uri"),
            "date": summary.get("published_at") or context.get("logical_date") or ""})
    return sorted(out, key=lambda r: (str(r["date"]), r["run_key"]), reverse=True)


def worker_logs(root: str, dag_id: str, run_key: str) -> list[tuple[str, str]]:
    """(step, file name) of every worker log the run kept, in pipeline order."""
    run = join_uri(runs_uri(root), dag_id, run_key)
    found = []
    for step in LOG_STEPS:
        base = join_uri(run, step, "logs") + "/"
        names = [uri[len(base):] for uri in storage.list_uris(base) if uri.startswith(base)]
        found += [(step, n) for n in sorted(names) if LOG_NAME.fullmatch(n)]
    return found


def log_groups(root: str, dag_id: str, run_key: str,
               logs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The run page's worker logs: per step, per provisioning attempt (in order, with its
    outcome from {step}/attempts.json when recorded), (worker, file name) pairs. A worker's
    plain `{role}-{index}.log` repeats its newest attempt's file, so it is listed only for
    workers that kept no attempt file (attempt None: logs written outside an attempt)."""
    run = join_uri(runs_uri(root), dag_id, run_key)
    out = []
    for step in LOG_STEPS:
        names = [name for s, name in logs if s == step]
        if not names:
            continue
        matches = [LOG_NAME.fullmatch(name) for name in names]
        with_attempts = {m["worker"] for m in matches if m["attempt"]}
        by_attempt: dict[int | None, list[tuple[str, str]]] = {}
        for m in matches:
            if m["attempt"] or m["worker"] not in with_attempts:
                attempt = int(m["attempt"]) if m["attempt"] else None
                by_attempt.setdefault(attempt, []).append((m["worker"], m.group(0)))
        records = read_json_or_none(join_uri(run, step, "attempts.json"))
        outcomes = {r.get("attempt"): r.get("outcome") for r in records
                    if isinstance(r, dict)} if isinstance(records, list) else {}
        attempts = [{"attempt": n, "outcome": outcomes.get(n) if n else None,
                     "files": sorted(files, key=_worker_order)}
                    for n, files in sorted(by_attempt.items(), key=lambda kv: kv[0] or 0)]
        out.append({"step": step, "attempts": attempts})
    return out


def _worker_order(pair: tuple[str, str]) -> tuple[str, int]:
    role, index = pair[0].rsplit("-", 1)
    return role, int(index)


def worker_log_uri(root: str, dag_id: str, run_key: str, step: str, name: str) -> str | None:
    """The URI of a log `worker_logs` lists; None for anything else."""
    if (step, name) not in worker_logs(root, dag_id, run_key):
        return None
    return join_uri(runs_uri(root), dag_id, run_key, step, "logs", name)


def train_goodput(run: str) -> dict[str, Any] | None:
    """The train step's goodput breakdown (tasks.runs.goodput); None when not measured or
    unreadable (the summary must not fail on one run's odd files)."""
    from tasks.runs import goodput
    try:
        return goodput.read_goodput(join_uri(run, "train"))
    except (ValueError, KeyError, TypeError, OSError):
        return None


def tracking(run: str) -> dict[str, Any] | None:
    """What the MLflow steps recorded (tasks/tracking/mlflow_log.py): `logged`, the run's
    logging and registration (mlflow/manifest.json), and `champion`, promote's move of the
    alias; None for a run that did not log to MLflow."""
    logged = _dict(join_uri(run, "mlflow", "manifest.json"))
    champion = _dict(join_uri(run, "promote", "manifest.json")).get("mlflow")
    champion = champion if isinstance(champion, dict) else None
    if not logged and not champion:
        return None
    return {"logged": logged or None, "champion": champion}


def long_texts(tokenized: dict) -> str | None:
    """The run page's line on windowed texts (long_text window), from the tokenize
    manifest's counts; None for a run that truncates (or before tokenize ran)."""
    if tokenized.get("long_text") != "window":
        return None
    splits = tokenized.get("splits") or {}
    # The data step's eval split holds the test rows (docs/experiments.md, Three roles).
    parts = [f"{role}: {split.get('num_windowed')} of {split.get('num_examples')} texts "
             f"windowed, {split.get('num_records')} windows"
             for name, role in (("train", "train"), ("validation", "validation"),
                                ("eval", "test"))
             if isinstance(split := splits.get(name), dict)]
    return (f"windows overlapping by {tokenized.get('window_stride')} pieces; "
            + "; ".join(parts))


def run_detail(root: str, dag_id: str, run_key: str, *,
               with_sweep: bool = True) -> dict[str, Any]:
    """A run's summary plus what its page draws: the training history, the evaluation metrics
    (confusion matrix, per class), the train manifest, the gate's decision and which steps
    have finished. With `with_sweep`: for a sweep folder its trials (`sweep`), plan
    (`sweep_record`) and best trial's own detail (`best`, None until one is chosen); for a
    trial, which sweep it belongs to (`trial_of`)."""
    run = join_uri(runs_uri(root), dag_id, run_key)
    detail = run_summary(root, dag_id, run_key)
    history = _dict(join_uri(run, "train", HISTORY))
    detail.update({
        "train": _dict(join_uri(run, "train", "manifest.json")),
        "history": [r for r in history.get("records") or [] if isinstance(r, dict)],
        "history_meta": {k: v for k, v in history.items() if k != "records"},
        "metrics": _dict(join_uri(run, "evaluate", "metrics.json")) or None,
        "gate": _dict(join_uri(run, "gate", "manifest.json")) or None,
        "comparison": _dict(join_uri(run, "gate_eval", "manifest.json")) or None,
        "goodput_detail": train_goodput(run),
        "mlflow": tracking(run),
        "steps_done": [s for s in ("data", "tokenize", "provision", "train", "evaluate",
                                   "release", "export", "gate_eval", "gate", "promote")
                       if storage.exists(join_uri(run, s, "manifest.json"))],
        "logs": worker_logs(root, dag_id, run_key),
        "long_texts": long_texts(_dict(join_uri(run, "tokenize", "manifest.json"))),
        "sweep": None, "sweep_record": None, "best": None, "trial_of": None,
    })
    if not with_sweep:
        return detail
    record = read_sweep(root, dag_id, run_key)
    if record is None:
        detail["trial_of"] = trial_of(root, dag_id, run_key)
        if detail["trial_of"]:
            detail["label"] = detail["trial_of"]["label"]
        return detail
    detail["sweep_record"] = record
    detail["sweep"] = sweep_trials(root, dag_id, run_key, record)
    if record["best"] and record["best"] != run_key:
        detail["best"] = run_detail(root, dag_id, record["best"], with_sweep=False)
        detail["best"]["label"] = next(t["label"] for t in record["trials"]
                                       if t["run_key"] == record["best"])
    return detail


def trial_label(values: Any, fallback: str = "") -> str:
    """A trial named by its searched values, exactly as configured (two trials never read
    the same), e.g. 'learning_rate=3e-05, per_replica_batch_size=16'; `fallback` (the label
    sweep.json stored) for a trial without values."""
    if not isinstance(values, dict) or not values:
        return fallback
    return ", ".join(f"{name}={value if isinstance(value, str) else json.dumps(value)}"
                     for name, value in values.items())


def read_sweep(root: str, dag_id: str, run_key: str) -> dict[str, Any] | None:
    """A sweep folder's plan and outcome: `{"metric", "space", "trials": [{"index",
    "run_key", "label", "values"}], "best": the chosen trial's run_key or None}` from its
    sweep.json and best/manifest.json; None for a folder that is not a sweep. Trials whose
    run_key is not a valid name (or is the sweep's own) are left out."""
    run = join_uri(runs_uri(root), dag_id, run_key)
    record = read_json_or_none(join_uri(run, SWEEP_FILE))
    if not isinstance(record, dict):
        return None
    trials = []
    for position, trial in enumerate(record.get("trials") or [], start=1):
        if not isinstance(trial, dict):
            continue
        key = str(trial.get("run_key", ""))
        if not valid_name(key) or key == run_key or any(t["run_key"] == key for t in trials):
            continue
        index = trial.get("index")
        if isinstance(index, bool):
            index = None
        values = trial.get("values") if isinstance(trial.get("values"), dict) else {}
        trials.append({"index": index if isinstance(index, int) else position,
                       "run_key": key, "values": values,
                       "label": trial_label(values, str(trial.get("label", "")))})
    chosen = _dict(join_uri(run, "best", "manifest.json")).get("best")
    best = chosen.get("run_key") if isinstance(chosen, dict) else None
    return {"metric": record.get("metric"), "space": record.get("space"), "trials": trials,
            "best": best if any(t["run_key"] == best for t in trials) else None}


def trial_of(root: str, dag_id: str, run_key: str) -> dict[str, Any] | None:
    """For a trial's folder (`{sweep}__trial-NN` listed in that sweep's sweep.json): its
    sweep's run_key, its index and label, whether it is the chosen one and how many trials
    the sweep has; None for any other folder."""
    match = TRIAL_KEY.fullmatch(run_key)
    if not match or not valid_name(match["sweep"]):
        return None
    record = read_sweep(root, dag_id, match["sweep"])
    for trial in (record or {}).get("trials") or []:
        if trial["run_key"] == run_key:
            return {"sweep_key": match["sweep"], "index": trial["index"],
                    "label": trial["label"], "best": record["best"] == run_key,
                    "trials": len(record["trials"])}
    return None


def sweep_trials(root: str, dag_id: str, run_key: str,
                 record: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
    """A sweep folder's trials (label, run_key, the validation figure of the weights each
    saved, how it ended, whether it is the chosen one) from its sweep.json, best/manifest.json
    and the trials' train manifests (`record`: read_sweep's, if already read); None
    for a folder that is not a sweep."""
    record = record or read_sweep(root, dag_id, run_key)
    if record is None:
        return None
    rows = []
    for trial in record["trials"]:
        trained = _dict(join_uri(runs_uri(root), dag_id, trial["run_key"], "train",
                                 "manifest.json"))
        validated = trained.get("validation") if isinstance(trained.get("validation"),
                                                            dict) else {}
        rows.append({"run_key": trial["run_key"], "index": trial["index"],
                     "label": trial["label"], "validation": validated.get("exported_value"),
                     "steps": trained.get("steps"), "outcome": trial_outcome(validated),
                     "best": trial["run_key"] == record["best"]})
    return rows


def trial_outcome(validated: dict) -> str:
    """How a trial's training ended, in words for the sweep table."""
    pruned = validated.get("pruned")
    if isinstance(pruned, str):
        return pruned
    if validated.get("stopped_early"):
        return f"stopped early (best at step {validated.get('best_step')})"
    return "trained to the end" if validated else ""


def models(root: str, locations: list[str] | None = None) -> list[dict[str, Any]]:
    """Per export location (the default first) and model name: its complete versions (newest
    first) with their metrics, and the champion pointer
    (`{location}/{model_name}/CHAMPION.json`, tasks.steps.promote)."""
    default = default_location(root)
    out = []
    for location in locations if locations is not None else export_locations(root):
        by_name: dict[str, list[str]] = {}
        for name, version in list_versions_at(location):
            by_name.setdefault(name, []).append(version)
        for name, versions in sorted(by_name.items()):
            champion = _dict(join_uri(location, name, CHAMPION)) or None
            rows = []
            for version in sorted(versions, reverse=True):
                metrics = _dict(join_uri(location, name, version, "metrics.json"))
                rows.append({"version": version, "uri": join_uri(location, name, version),
                             "accuracy": metrics.get("accuracy"),
                             "macro_f1": metrics.get("macro_f1"),
                             "champion": bool(champion) and champion.get("version") == version})
            out.append({"model": name, "champion": champion, "versions": rows,
                        "location": location, "location_id": location_id(location),
                        "default_location": location == default})
    return out
