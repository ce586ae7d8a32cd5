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
        "gate_eval": {"export"},
        "gate": {"export", "gate_eval"},
        "approval": {"gate"},
        "log_to_mlflow": {"export"},
        "promote": {"export", "approval", "log_to_mlflow"},
    }
    # Every task reads the run folder that validate created (approval reads the gate's XCom).
    assert all("validate" in t.upstream_task_ids for t in dag.tasks
               if t.task_id not in ("validate", "approval"))


def test_approval_is_the_providers_approval_operator_answered_by_default_with_reject(dag):
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    approval = dag.get_task("approval")
    assert isinstance(approval, ApprovalOperator)
    assert approval.options == ["Approve", "Reject"] and approval.defaults == ["Reject"]
    # promote runs after an answer and after a skip (no approval asked), not after a failure
    assert dag.get_task("promote").trigger_rule == "none_failed"


def test_an_answer_is_recorded_and_nothing_downstream_is_skipped(dag):
    """The real operator's resume path with the events Airflow sends: a person's answer and
    the scheduler's timeout sweep (defaults applied, timedout set). ApprovalOperator itself
    would skip promote on Reject; ours returns the answer for promote to record."""
    from datetime import datetime, timezone

    approval = dag.get_task("approval")
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    answer = approval.execute_complete({}, {
        "chosen_options": ["Reject"], "params_input": {}, "responded_at": at,
        "responded_by_user": {"id": "1", "name": "ana"}})
    assert answer == {"approved": False, "timed_out": False, "by": "ana",
                      "at": "2026-01-02T03:04:05+00:00"}
    answer = approval.execute_complete({}, {
        "chosen_options": ["Reject"], "params_input": {}, "responded_at": at,
        "responded_by_user": None, "timedout": True})
    assert answer["approved"] is False and answer["timed_out"] is True and answer["by"] == ""
    answer = approval.execute_complete({}, {
        "chosen_options": ["Approve"], "params_input": {}, "responded_at": at,
        "responded_by_user": {"id": "1", "name": "ana"}})
    assert answer["approved"] is True


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
    # Not a speed target (about 0.8 s on a quiet 2-core machine for the four DAG files): a
    # bound that only a heavy import breaks, well inside Airflow's dagbag_import_timeout (30 s),
    # where a loaded test machine cannot make it fail.
    assert float(elapsed) < 10.0


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


def test_default_schedule_is_backfill_only():
    """Without BERTFLOW_SCHEDULE: periodic (the UI's Backfill option and backfill creation
    need it), never a run of its own (the scheduler's restriction: catchup off, no end), and
    one @daily interval per date for a backfill (backfill's restriction: catchup on, from-to),
    after a round trip through the serializer the dag processor uses."""
    code = f"""
import os
os.environ.pop("BERTFLOW_SCHEDULE", None)
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
from airflow.timetables.base import TimeRestriction
from pendulum import datetime
dag = DagBag(dag_folder={str(DAGS)!r}).dags["bert_finetune"]
core = DagSerialization.from_dict(DagSerialization.to_dict(dag)).timetable
print(type(core).__name__, core.periodic, core.summary)
print(core.next_dagrun_info(last_automated_data_interval=None,
                            restriction=TimeRestriction(datetime(2024, 1, 1), None, False)))
backfill = TimeRestriction(datetime(2024, 3, 1), datetime(2024, 3, 2), True)
first = core.next_dagrun_info(last_automated_data_interval=None, restriction=backfill)
second = core.next_dagrun_info(last_automated_data_interval=first.data_interval,
                               restriction=backfill)
third = core.next_dagrun_info(last_automated_data_interval=second.data_interval,
                              restriction=backfill)
print(first.data_interval.start.date(), first.data_interval.end.date(),
      second.data_interval.start.date(), third)
"""
    env = {k: v for k, v in os.environ.items() if k != "BERTFLOW_SCHEDULE"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-3:] == [
        "BackfillOnlyTimetable True backfills only (0 0 * * * intervals)",
        "None",
        "2024-03-01 2024-03-02 2024-03-02 None"]


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
