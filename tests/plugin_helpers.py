"""Shared by the plugin tests: Airflow's real api-server app with a JWT, and a synthetic
artifact tree (two experiments, three runs, a champion, histories, metrics) written through
tasks.io.storage exactly where the steps write them. Import the fixtures into a test module to
use them (conftest.py belongs to the orchestration tests)."""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tasks.io import storage
from tasks.io.uris import join_uri

DAG_ID = "bert_finetune"
MODEL = "bert-classifier"
# One label needs escaping: the page must never emit stored text as markup.
LABELS = ["billing", "<b>ug", "feature"]

# run_key -> (experiment, logical date, run id, config, train manifest, accuracy, macro-F1,
#             exported version)
RUNS = {
    "baseline__2024-01-01T00_00_00_00_00": (
        "baseline", "2024-01-01T00:00:00+00:00", "scheduled__2024-01-01T00:00:00+00:00",
        {"learning_rate": 5e-5, "epochs": 3, "per_replica_batch_size": 32,
         "max_seq_length": 128, "strategy": "auto", "provisioner": "local"},
        {"strategy": "one_device", "global_batch_size": 32, "examples_per_second": 51.25,
         "train_seconds": 125.0, "steps": 36},
        0.8123, 0.7011, "v20240101T000500-aaaaaaaa"),
    "baseline__2024-01-02T00_00_00_00_00": (
        "baseline", "2024-01-02T00:00:00+00:00", "scheduled__2024-01-02T00:00:00+00:00",
        {"learning_rate": 3e-5, "epochs": 4, "per_replica_batch_size": 32,
         "max_seq_length": 128, "strategy": "auto", "provisioner": "local"},
        {"strategy": "one_device", "global_batch_size": 32, "examples_per_second": 49.5,
         "train_seconds": 160.0, "steps": 48},
        0.8456, 0.7789, "v20240102T000500-bbbbbbbb"),
    "manual__2024-02-01T10_00_00_00_00": (
        "long-seq", "", "manual__2024-02-01T10:00:00+00:00",
        {"learning_rate": 2e-5, "epochs": 2, "per_replica_batch_size": 16,
         "max_seq_length": 256, "strategy": "multi_worker_mirrored",
         "provisioner": "kubernetes"},
        {"strategy": "multi_worker_mirrored", "global_batch_size": 64,
         "examples_per_second": 210.75, "train_seconds": 900.0, "steps": 20},
        0.9012, 0.8876, "v20240201T101500-cccccccc"),
}
CHAMPION_RUN = "manual__2024-02-01T10_00_00_00_00"


def history(total_steps: int) -> dict:
    records = [{"step": s, "epoch": round(s / 12, 3), "loss": 1.1 * math.exp(-s / 10) + 0.05,
                "accuracy": min(0.98, 0.33 + s / 40), "elapsed_seconds": s * 2.5,
                "learning_rate": 5e-5 * min(1.0, s / 4) * (1 - s / (total_steps + 1))}
               for s in range(1, total_steps + 1)]
    return {"total_steps": total_steps, "steps_per_epoch": 12, "every": 1, "records": records}


def build_artifacts(root: str) -> None:
    """Run folders and published model versions as the pipeline's steps leave them."""
    models = join_uri(root, "models", MODEL)
    for run_key, (experiment, logical, run_id, config, train, acc, f1, version) in RUNS.items():
        run = join_uri(root, "runs", DAG_ID, run_key)
        storage.write_json(join_uri(run, "context.json"), {
            "artifact_root": root, "dag_id": DAG_ID, "run_key": run_key, "run_id": run_id,
            "experiment": experiment, "logical_date": logical, "run_dir": ""})
        storage.write_json(join_uri(run, "config.json"), {"experiment": experiment, **config})
        storage.write_json(join_uri(run, "train", "manifest.json"), {
            **train, "tensorboard_dir": join_uri(run, "train", "tensorboard")})
        storage.write_json(join_uri(run, "train", "history.json"), history(train["steps"]))
        matrix = [[40, 3, 2], [4, 30, 1], [1, 2, 17]]
        metrics = {"accuracy": acc, "macro_f1": f1, "labels": LABELS, "num_examples": 100,
                   "confusion_matrix": matrix,
                   "per_class": {lb: {"precision": 0.8, "recall": 0.8, "f1": 0.8,
                                      "support": sum(matrix[i])}
                                 for i, lb in enumerate(LABELS)}}
        storage.write_json(join_uri(run, "evaluate", "metrics.json"), metrics)
        storage.write_json(join_uri(run, "evaluate", "manifest.json"), {
            "metrics_uri": join_uri(run, "evaluate", "metrics.json"), "num_examples": 100,
            "metrics": {"accuracy": acc, "macro_f1": f1}})
        storage.write_json(join_uri(run, "export", "manifest.json"), {
            "version_uri": join_uri(models, version), "version": version, "model_name": MODEL,
            "experiment": experiment, "logical_date": logical or None})
        promoted = run_key == CHAMPION_RUN
        storage.write_json(join_uri(run, "promote", "manifest.json"), {
            "promoted": promoted, "reason": "accuracy 0.9012; beats champion" if promoted
            else "accuracy below the champion"})
        storage.write_json(join_uri(models, version, "metrics.json"), metrics)
        storage.write_text(join_uri(models, version, "model_card.md"), f"# {MODEL} {version}\n")
        storage.write_json(join_uri(models, version, storage.COMPLETE), {"files": []})
    champion = RUNS[CHAMPION_RUN][-1]
    storage.write_json(join_uri(models, "CHAMPION.json"), {
        "version": champion, "version_uri": join_uri(models, champion), "metric": "accuracy",
        "value": 0.9012, "previous": None, "promoted_at": "2024-02-01T10:20:00+00:00"})
    # Half-published (no _COMPLETE.json): never listed.
    storage.write_text(join_uri(models, "v20240301T000000-dddddddd", "model_card.md"), "part")


# Runs of experiment "offsite" exporting outside the artifact root (build_export_elsewhere):
# run_key -> (logical date, export_uri as set (may be templated), accuracy, version)
ELSEWHERE_RUNS = {
    "offsite__2024-03-01T00_00_00_00_00": ("2024-03-01", "{base}/shared", 0.8500,
                                           "v20240301T000500-eeeeeeee"),
    "offsite__2024-03-02T00_00_00_00_00": ("2024-03-02", "{base}/shared/", 0.8000,
                                           "v20240302T000500-ffffffff"),
    "offsite__2024-03-03T00_00_00_00_00": ("2024-03-03", "{base}/daily/{{ds}}", 0.7000,
                                           "v20240303T000500-99999999"),
}


def build_export_elsewhere(root: str, base: str, scratch: Path) -> dict[str, str]:
    """Three runs under `root` whose export_uri is outside it, made by the pipeline's own code:
    the URI resolved for the run's date (tasks.io.uri_templates), config.json and context.json
    written by runlayout.init_run, the version published with storage.publish_dir, the
    champion set by tasks.steps.promote.run. Two runs share `{base}/shared` (the first is its
    champion: the second regresses by more than the gate allows); the third exports to
    `{base}/daily/2024-03-03` and is that location's champion. Returns run_key -> the
    resolved export location."""
    from tasks.steps import promote
    from tasks.runs import runlayout
    from tasks.io import uri_templates
    from tasks.config import parse_config
    from tasks.runs.runlayout import RunContext

    scratch.mkdir(parents=True, exist_ok=True)
    locations = {}
    for run_key, (day, export_uri, accuracy, version) in ELSEWHERE_RUNS.items():
        logical = datetime.fromisoformat(day).replace(tzinfo=timezone.utc)
        values = uri_templates.resolve(
            {"export_uri": export_uri.format(base=base)},
            uri_templates.RunDates(logical, logical, logical))
        cfg = parse_config({"artifact_root": root, "experiment": "offsite",
                            "model_name": MODEL, "learning_rate": 4e-5,
                            "gate_max_regression": 0.02, **values})
        ctx = RunContext(artifact_root=root, dag_id=DAG_ID, run_key=run_key,
                         run_id=f"backfill__{logical.isoformat()}", experiment="offsite",
                         logical_date=logical.isoformat())
        runlayout.init_run(cfg, ctx)
        metrics = {"accuracy": accuracy, "macro_f1": accuracy - 0.1}
        runlayout.write_manifest(ctx.step_uri("evaluate"), {"metrics": metrics})
        folder = scratch / version
        folder.mkdir()
        (folder / "metrics.json").write_text(json.dumps(metrics))
        (folder / "model_card.md").write_text(f"# {MODEL} {version} (offsite)\n")
        version_uri = join_uri(cfg.resolved_export_uri(), MODEL, version)
        storage.publish_dir(folder, version_uri)
        runlayout.write_manifest(ctx.step_uri("export"), {
            "version_uri": version_uri, "version": version, "model_name": MODEL,
            "experiment": "offsite", "logical_date": ctx.logical_date})
        promote.run(cfg, ctx)
        locations[run_key] = cfg.resolved_export_uri().rstrip("/")
    return locations


# A 2-trial sweep of experiment "tune" (build_sweep): its folder and one per trial under
# runs/bert_sweep/, as tasks/runs/sweep.py and the steps leave them.
SWEEP_DAG = "bert_sweep"
SWEEP_KEY = "tune__2024-04-01T00_00_00_00_00"
SWEEP_SPACE = {"grid": {"learning_rate": [3e-5, 5e-5], "per_replica_batch_size": [16]}}
# trial index -> (accuracy, macro-F1); trial 2 is the best
SWEEP_METRICS = {1: (0.8125, 0.75), 2: (0.875, 0.8333)}
SWEEP_VERSION = "v20240401T013000-5eeeeeee"


def build_sweep(root: str, scratch: Path, experiment: str = "tune") -> dict:
    """A finished 2-trial sweep: init_sweep's folders and sweep.json, each trial's train
    manifest, history and evaluation, pick_best's best/manifest.json, then the best trial's
    export (a published version), the gate (tasks.steps.promote.check) and the promotion
    (promote.run), as bert_sweep runs them on the best trial's folder. Returns {"sweep": RunContext, "trials": [RunContext], "best": RunContext, "gate": dict}."""
    from tasks.runs import runlayout, sweep
    from tasks.runs.runlayout import RunContext
    from tasks.steps import promote

    logical = "2024-04-01T00:00:00+00:00"
    plan = sweep.plan({"artifact_root": root, "experiment": experiment, "model_name": MODEL,
                       "epochs": 2, "max_seq_length": 64}, SWEEP_SPACE)
    ctx = RunContext(root, SWEEP_DAG, SWEEP_KEY, f"backfill__{logical}", experiment, logical)
    sweep.init_sweep(plan, ctx, max_parallel_trials=2)
    trials = []
    labels = LABELS
    for planned in plan.trials:
        tctx = sweep.trial_context(ctx, planned.index)
        accuracy, f1 = SWEEP_METRICS[planned.index]
        steps = 10 * planned.index
        runlayout.write_manifest(tctx.step_uri("train"), {
            "strategy": "one_device", "global_batch_size": 16, "per_replica_batch_size": 16,
            "examples_per_second": 40.0 + planned.index, "train_seconds": 60.0 * planned.index,
            "steps": steps, "tensorboard_dir": join_uri(tctx.step_uri("train"), "tensorboard"),
            # the figure the sweep ranks trials by (tasks/training/validation.py)
            "validation": {"metric": "accuracy", "exported_value": accuracy - 0.0625,
                           "best_step": steps, "stopped_early": False, "pruned": None}})
        storage.write_json(join_uri(tctx.step_uri("train"), "history.json"), history(steps))
        matrix = [[10, 1, 1], [2, 9, 1], [0, 1, 7 + planned.index]]
        metrics = {"accuracy": accuracy, "macro_f1": f1, "labels": labels,
                   "num_examples": sum(map(sum, matrix)), "confusion_matrix": matrix,
                   "per_class": {lb: {"precision": 0.8, "recall": 0.8, "f1": 0.8,
                                      "support": sum(matrix[i])}
                                 for i, lb in enumerate(labels)}}
        metrics_uri = join_uri(tctx.step_uri("evaluate"), "metrics.json")
        storage.write_json(metrics_uri, metrics)
        runlayout.write_manifest(tctx.step_uri("evaluate"), {
            "metrics_uri": metrics_uri, "num_examples": metrics["num_examples"],
            "metrics": {"accuracy": accuracy, "macro_f1": f1}})
        trials.append((tctx, planned.cfg, metrics))
    chosen = sweep.pick_best(ctx.run_uri)
    best_ctx, best_cfg, best_metrics = next(t for t in trials
                                            if t[0].run_uri == chosen["best"]["run_uri"])
    folder = scratch / SWEEP_VERSION
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(best_metrics))
    (folder / "model_card.md").write_text(f"# {MODEL} {SWEEP_VERSION} (sweep)\n")
    version_uri = join_uri(best_cfg.resolved_export_uri(), MODEL, SWEEP_VERSION)
    storage.publish_dir(folder, version_uri)
    runlayout.write_manifest(best_ctx.step_uri("export"), {
        "version_uri": version_uri, "version": SWEEP_VERSION, "model_name": MODEL,
        "experiment": experiment, "logical_date": logical})
    gate = promote.check(best_cfg, best_ctx)
    promote.run(best_cfg, best_ctx)
    return {"sweep": ctx, "trials": [t[0] for t in trials], "best": best_ctx, "gate": gate}


@pytest.fixture(scope="module")
def api_server(airflow_db):
    """Airflow's api-server app (core API, auth manager, plugins) as `airflow api-server`
    builds it, plus a JWT for the admin user the simple auth manager knows."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    client = TestClient(create_app(apps="core"))
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin",
                                                                  role="admin"))
    return client, token


@pytest.fixture
def logged_in(api_server):
    """The test client carrying the UI's login cookie."""
    client, token = api_server
    client.cookies.set("_token", token)
    yield client
    client.cookies.clear()
