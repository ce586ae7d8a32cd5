"""DAG integrity: parses cleanly and fast, without TensorFlow, with the expected wiring."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.config import RunConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DAGS = PROJECT_ROOT / "dags"


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


@pytest.fixture(scope="module")
def dag(dagbag):
    return dagbag.dags["bert_finetune"]


def test_dag_folder_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert "bert_finetune" in dagbag.dags


def test_task_ids_and_dependencies(dag):
    upstream = {t.task_id: set(t.upstream_task_ids) - {"validate"} for t in dag.tasks}
    assert upstream == {
        "validate": set(),
        "prepare_data": set(),
        "tokenize": {"prepare_data"},
        "provision": {"tokenize"},
        "train": {"provision"},
        "evaluate": {"train"},
        "release": {"evaluate", "provision"},
        "export": {"evaluate", "release"},
        "promote": {"export"},
    }
    # Every task reads the run folder that validate created.
    assert all("validate" in t.upstream_task_ids for t in dag.tasks if t.task_id != "validate")


def test_provision_and_release_are_setup_and_teardown(dag):
    provision, release = dag.get_task("provision"), dag.get_task("release")
    assert provision.is_setup and release.is_teardown
    assert release.trigger_rule == "all_done_setup_success"
    assert dag.get_task("export").trigger_rule == "all_success"


def test_params_come_from_run_config_with_titles_and_enums(dag):
    assert sorted(dag.params.keys()) == sorted(RunConfig.model_fields)
    for name, field in RunConfig.model_fields.items():
        schema = dag.params.get_param(name).schema
        assert schema["title"] == field.title, name
    assert "multi_worker_mirrored" in dag.params.get_param("strategy").schema["enum"]
    assert dag.params.get_param("max_seq_length").schema["maximum"] == 512
    assert dag.params["epochs"] == RunConfig().epochs


def test_a_run_given_only_a_train_file_holds_out_a_split(dag):
    """The DAG's Params leave eval_uri empty: a conf (trigger form, backfill, data event) with
    only train_uri evaluates on a split of it, not on the demo's eval file."""
    from tasks.config import parse_config

    assert dag.params["eval_uri"] is None
    conf = {**{name: dag.params[name] for name in dag.params.keys()},
            "train_uri": "gs://bucket/reviews/{ds}/train.tsv"}
    assert parse_config(conf).eval_uri is None


def test_heavy_steps_run_in_worker_controllers(dag):
    for task_id in ("tokenize", "train", "evaluate", "export"):
        op = dag.get_task(task_id)
        assert type(op).__name__ == "WorkerStepOperator" and op.step == task_id
    assert dag.get_task("train").distributed and not dag.get_task("export").distributed


def test_promote_emits_the_promoted_model_asset_alias(dag):
    assert [o.name for o in dag.get_task("promote").outlets] == ["bertflow-promoted-model"]


def test_promotes_of_concurrent_runs_take_turns(dag):
    """Two runs' first events for a new model would create its asset at once and fail one
    promote on the unique index (a backfill on Postgres did): one promote at a time."""
    assert dag.get_task("promote").max_active_tis_per_dag == 1


def test_parses_fast_and_never_imports_tensorflow():
    # A fresh interpreter: this test process may already hold TensorFlow from other tests.
    code = f"""
import sys, time
import airflow.sdk, pydantic  # the dag processor has these loaded already
start = time.monotonic()
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder={str(DAGS)!r})
elapsed = time.monotonic() - start
assert not bag.import_errors, bag.import_errors
heavy = [m for m in ("tensorflow", "transformers", "tensorflow_text") if m in sys.modules]
print(elapsed, heavy)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PROJECT_ROOT)
    assert done.returncode == 0, done.stderr
    elapsed, heavy = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert heavy == "[]"
    assert float(elapsed) < 2.0


def test_schedule_comes_from_the_environment():
    code = f"""
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.encoders import coerce_to_core_timetable
from pendulum import datetime
dag = DagBag(dag_folder={str(DAGS)!r}).dags["bert_finetune"]
core = coerce_to_core_timetable(dag.timetable)
# periodic: what `airflow backfill create` requires; a real data interval per run
interval = core.infer_manual_data_interval(run_after=datetime(2026, 11, 10, 12))
print(type(core).__name__, core.periodic, interval.start.date(), interval.end.date())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, env={**os.environ, "BERTFLOW_SCHEDULE": "@weekly"})
    assert done.returncode == 0, done.stderr
    # Sunday-to-Sunday weeks: the run after 2026-11-10 covers the week before it.
    assert done.stdout.strip().splitlines()[-1] == (
        "CronDataIntervalTimetable True 2026-11-01 2026-11-08")


def test_janitor_sweeps_the_configured_backend_on_its_schedule():
    code = f"""
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder={str(DAGS)!r})
dag = bag.dags["bertflow_janitor"]
print(bag.import_errors, dag.schedule, dag.params["provisioner"], dag.params["k8s_namespace"])
"""
    conf = '{"provisioner": "kubernetes", "k8s_namespace": "ml"}'
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, env={**os.environ, "BERTFLOW_JANITOR_CONF": conf,
                                                 "BERTFLOW_JANITOR_SCHEDULE": "@daily"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "{} @daily kubernetes ml"
