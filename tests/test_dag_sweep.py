"""bert_sweep's wiring, and a bad search space through dag.test(). A whole sweep (4 trials under
a cap of 2 on a real scheduler, compared with a plain bert_finetune run) runs in
tests/test_airflow_standalone.py; tasks/runs/sweep.py's parts in tests/test_sweep.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tasks.params_form import param_schemas
from train_helpers import tiny_model_dir  # noqa: F401

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
    assert "trial.train" in upstream["trial.release"]
    assert "trial.train" in upstream["pick_best"]
    # Trials are ranked on validation; only the best one is evaluated on the test rows.
    assert upstream["evaluate"] == {"pick_best"}
    assert upstream["export"] == {"pick_best", "evaluate"}
    assert "export" in upstream["gate_eval"] and "gate_eval" in upstream["gate"]
    assert "gate" in upstream["approval"] and "approval" in upstream["promote"]
    mapped = {t.task_id for t in dag.tasks if t.get_needs_expansion()}
    assert mapped == {"tokenize", "trial.wait_for_slot", "trial.provision", "trial.train",
                      "trial.release"}


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
    assert set(dag.params) == set(param_schemas()) | {"search_space", "max_parallel_trials",
                                                      "sweep_pruning"}
    assert dag.params.get_param("sweep_pruning").schema["enum"] == ["none", "median", "asha"]
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


def _separable_tsv(path: Path, rows: int) -> str:
    """Texts of the tiny model's words (tests/train_helpers.py): each label has its own half
    of the vocabulary, so a trial with a working learning rate learns it in a few steps."""
    import random

    from train_helpers import WORDS

    rng = random.Random(0)
    lines = ["text\tlabel"]
    for i in range(rows):
        label = i % 2
        words = [f"w{rng.randrange(*WORDS[label])}" for _ in range(rng.randint(3, 12))]
        lines.append(f"{' '.join(words)}\t{('neg', 'pos')[label]}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_pruned_sweep_names_the_pruned_trial_and_reads_test_once(airflow_db, tmp_path, dag,
                                                                  tiny_model_dir,  # noqa: F811
                                                                  monkeypatch):
    """Three trials one after another (max_parallel_trials 1: dag.test alone runs mapped
    instances in no fixed order), the third with a learning rate too small to learn: at the
    first evaluation where the two before it have learned, it validates below their median,
    so the median rule stops it. Its train task ends named as
    pruned; the best of the others is the only trial evaluated on the test rows."""
    # A waiting trial pokes again after poke_interval (20 s, for a real scheduler); dag.test
    # sat idle for most of each wait. The order the slots give is the same at 1 s.
    monkeypatch.setattr(dag.get_task("trial.wait_for_slot"), "poke_interval", 1)
    root = tmp_path / "artifacts"
    run = dag.test(run_conf={
        "artifact_root": str(root), "base_model": str(tiny_model_dir),
        "train_uri": _separable_tsv(tmp_path / "train.tsv", 240), "test_uri": "",
        "max_seq_length": 16, "num_shards": 1, "epochs": 2, "max_steps": 24,
        "per_replica_batch_size": 16, "eval_every_steps": 4, "warmup_ratio": 0.1,
        "mixed_precision": "none", "model_name": "pruned-sweep", "sweep_pruning": "median",
        "search_space": {"grid": {"learning_rate": [1e-2, 5e-3, 1e-9]}},
        "max_parallel_trials": 1})
    instances = run.get_task_instances()
    tis = {(ti.task_id, ti.map_index): ti.state for ti in instances}
    assert run.state == "success", sorted(tis.items())
    assert all(tis[("trial.train", i)] == "success" for i in range(3))
    names = {ti.map_index: ti.rendered_map_index for ti in instances
             if ti.task_id == "trial.train"}
    assert names == {0: "learning_rate=0.01", 1: "learning_rate=0.005",
                     2: "learning_rate=1e-09 (pruned)"}
    assert all(tis[("trial.release", i)] == "success" for i in range(3))
    for task in ("pick_best", "evaluate", "export", "gate_eval", "gate", "promote"):
        assert tis[(task, -1)] == "success", task

    from tasks.io import storage
    from tasks.io.uris import join_uri

    sweep_uri = next(p for p in (root / "runs" / "bert_sweep").iterdir()
                     if "__trial-" not in p.name)
    best = storage.read_json(join_uri(str(sweep_uri), "best", "manifest.json"))
    pruned = best["trials"][2]
    assert pruned["pruned"].startswith("pruned at step ") and "median" in pruned["pruned"]
    assert not pruned["ranked"] and best["best"]["index"] in (1, 2)
    # The test rows were read once: by the best trial's evaluate (and then the gate).
    for row in best["trials"]:
        trained = storage.read_json(join_uri(row["run_uri"], "train", "manifest.json"))
        assert trained["evaluation"] is None  # no test evaluation inside any trial
        evaluated = storage.exists(join_uri(row["run_uri"], "evaluate", "manifest.json"))
        assert evaluated == (row["index"] == best["best"]["index"])
    evaluation = storage.read_json(join_uri(best["best"]["run_uri"], "evaluate",
                                            "manifest.json"))
    assert evaluation["evaluated_in"] == "evaluate" and evaluation["strategy"] == "one_device"
