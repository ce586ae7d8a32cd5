"""A sweep's pruning rules (tasks/runs/pruning.py) on real sweep folders: the median stopping
rule, ASHA's rungs, how many peers each needs, and which run folders are trials."""
from __future__ import annotations

import pytest

from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.runs import pruning, sweep
from tasks.runs.runlayout import RunContext

BASE = {"epochs": 1, "max_steps": 40, "eval_every_steps": 10}


def folders(root, rule: str, trials: int = 5):
    plan = sweep.plan(BASE, {"grid": {"seed": list(range(1, trials + 1))}}, pruning=rule)
    ctx = RunContext(root, "bert_sweep", "s1", "manual__1")
    out = sweep.init_sweep(plan, ctx, max_parallel_trials=2)
    return [t["run_uri"] for t in out["trials"]]


def validated(run_uri: str, curve: dict[int, float]) -> None:
    storage.write_json(join_uri(run_uri, "train", "history.json"), {"validation": [
        {"step": step, "accuracy": value, "seconds": 0.1} for step, value in curve.items()]})


def test_the_median_rule_stops_a_trial_below_its_peers_median(tmp_path):
    runs = folders(str(tmp_path), "median")
    pruner = pruning.for_run(runs[4], "accuracy", 10)
    validated(runs[0], {10: 0.6, 20: 0.7})
    assert pruner.check(10, 0.1) is None  # one peer at step 10: too few to judge
    validated(runs[1], {10: 0.8, 20: 0.9})
    validated(runs[2], {10: 0.5})
    assert pruner.check(10, 0.6) is None  # the median of 0.6, 0.8, 0.5 is 0.6: not below
    reason = pruner.check(10, 0.55)
    assert reason == ("pruned at step 10: accuracy 0.5500 is below the median 0.6000 of the "
                      "3 other trials there (median rule)")
    # Two peers reached step 20 (0.7, 0.9): their median, 0.8, is the bar there.
    assert pruner.check(20, 0.75).startswith("pruned at step 20")
    assert pruner.check(20, 0.85) is None


def test_asha_judges_at_rungs_only_and_keeps_the_top_third(tmp_path):
    runs = folders(str(tmp_path), "asha")
    pruner = pruning.for_run(runs[0], "accuracy", 10)
    # Rungs: 10 x 3**k steps.
    assert [s for s in range(10, 300, 10) if pruner.is_rung(s)] == [10, 30, 90, 270]
    validated(runs[1], {10: 0.5, 20: 0.9})
    assert pruner.check(10, 0.1) is None  # 2 trials at the rung: fewer than 3
    validated(runs[2], {10: 0.7, 20: 0.9})
    # 3 trials at the rung (0.7, 0.5 and ours): the top 1 goes on.
    assert pruner.check(10, 0.8) is None
    assert pruner.check(10, 0.6) == ("pruned at step 10: accuracy 0.6000 is not in the top 1 "
                                     "of the 3 trials at this rung (asha, reduction 3)")
    assert pruner.check(20, 0.1) is None  # step 20 is no rung


def test_only_trials_of_a_pruning_sweep_get_a_pruner(tmp_path):
    runs = folders(str(tmp_path / "none"), "none")
    assert pruning.for_run(runs[0], "accuracy", 10) is None
    assert pruning.sweep_uri_of(runs[0]).endswith("/runs/bert_sweep/s1")
    assert pruning.sweep_uri_of(str(tmp_path / "runs" / "bert_finetune" / "r1")) is None
    assert pruning.for_run(str(tmp_path / "runs" / "bert_finetune" / "r1"), "f1", 10) is None


@pytest.mark.parametrize("rule", ["median", "asha"])
def test_a_trial_is_never_its_own_peer(tmp_path, rule):
    runs = folders(str(tmp_path), rule, trials=3)
    for run in runs:
        validated(run, {10: 0.5})
    pruner = pruning.for_run(runs[0], "accuracy", 10)
    assert sorted(pruner.peers(10)) == [0.5, 0.5]
