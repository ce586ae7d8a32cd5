"""bert_sweep's wiring, and a bad search space through dag.test(). A whole sweep (4 trials under
a cap of 2 on a real scheduler, compared with a plain bert_finetune run) runs in
tests/test_airflow_standalone.py; tasks/runs/sweep.py's parts in tests/test_sweep.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tasks.params_form import param_schemas

DAGS = Path(__file__).resolve().parent.parent / "dags"


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["bert_sweep"]


def test_data_once_tokenize_per_length_then_mapped_trials_then_the_best(dag):
    upstream = {t.task_id: t.upstream_task_ids for t in dag.tasks}
    assert upstream["prepare_data"] == {"validate"}
    assert "prepare_data" in upstream["share_data"]
    assert upstream["tokenize"] == {"share_data"}
    assert "tokenize" in upstream["share_tokens"]
    assert upstream["trial.wait_for_slot"] == {"share_tokens"}
    assert "trial.wait_for_slot" in upstream["trial.provision"]
    assert "trial.provision" in upstream["trial.train"]
    assert "trial.train" in upstream["trial.evaluate"]
    assert "trial.evaluate" in upstream["pick_best"]
    assert upstream["export"] == {"pick_best"}
    assert "export" in upstream["gate"] and "gate" in upstream["approval"]
    assert "approval" in upstream["promote"]
    mapped = {t.task_id for t in dag.tasks if t.get_needs_expansion()}
    assert mapped == {"tokenize", "trial.wait_for_slot", "trial.provision", "trial.train",
                      "trial.evaluate", "trial.release"}


def test_each_trial_provisions_and_releases_its_own_workers(dag):
    assert dag.get_task("trial.provision").is_setup
    release = dag.get_task("trial.release")
    assert release.is_teardown and "trial.provision" in release.upstream_task_ids


def test_the_slot_wait_holds_no_worker_slot(dag):
    wait = dag.get_task("trial.wait_for_slot")
    assert wait.mode == "reschedule"


def test_the_best_is_picked_from_whatever_trials_were_evaluated(dag):
    assert dag.get_task("pick_best").trigger_rule == "all_done_min_one_success"


def test_params_are_bert_finetune_s_and_the_sweep_s(dag):
    assert set(dag.params) == set(param_schemas()) | {"search_space", "max_parallel_trials"}
    cap = dag.params.get_param("max_parallel_trials").schema
    assert (cap["type"], cap["minimum"]) == ("integer", 1)
    assert dag.params.get_param("search_space").schema["type"] == "object"


def test_a_bad_trial_fails_validate_before_any_folder_or_worker(airflow_db, tmp_path, dag):
    root = tmp_path / "artifacts"
    run = dag.test(run_conf={
        "artifact_root": str(root), "training_loop": "fit", "max_steps": 1,
        "search_space": {"grid": {"grad_accum_steps": [1, 2]}}})
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "failed"
    assert states["validate"] == "failed"
    assert states["prepare_data"] == "upstream_failed"
    assert states["pick_best"] == "upstream_failed"
    assert not root.exists() or not any(root.rglob("config.json"))
