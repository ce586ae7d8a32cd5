"""tasks/runs/sweep.py: trial configs checked whole, the shared config, the folders and shared
manifests, the slot rule and the choice of the best trial (no Airflow, no TensorFlow)."""
from __future__ import annotations

import random

import pytest

from tasks.config import parse_config

from tasks.io.uris import join_uri
from tasks.errors import BertflowError, ConfigError
from tasks.io import storage
from tasks.runs import runlayout, sweep
from tasks.runs.runlayout import RunContext

BASE = {"epochs": 1, "max_steps": 3, "learning_rate": 5e-5}
# What a sweep adds to its base: trials are ranked on validation rows held out of train, and
# never read the test rows (the sweep evaluates its best trial on them, once).
SWEPT = {**BASE, "validation_fraction": 0.1, "evaluate_in_train": False}


def test_each_trial_is_the_base_with_its_values_and_shared_fields_join_the_base():
    plan = sweep.plan(BASE, {"grid": {"learning_rate": [3e-5, 1e-4], "seed": [7]}})
    assert [t.values for t in plan.trials] == [{"learning_rate": 3e-5, "seed": 7},
                                              {"learning_rate": 1e-4, "seed": 7}]
    assert [t.cfg for t in plan.trials] == [
        parse_config({**SWEPT, "learning_rate": 3e-5, "seed": 7}),
        parse_config({**SWEPT, "learning_rate": 1e-4, "seed": 7})]
    # seed is the same in every trial, so the data split uses it, as a plain run would.
    assert plan.shared == parse_config({**SWEPT, "seed": 7})
    assert [t.label for t in plan.trials] == ["learning_rate=3e-05 seed=7",
                                             "learning_rate=0.0001 seed=7"]


def test_a_sweep_over_one_value_is_the_plain_run_of_that_config():
    plan = sweep.plan(BASE, {"grid": {"learning_rate": [3e-5]}})
    assert plan.shared == plan.trials[0].cfg == parse_config({**SWEPT, "learning_rate": 3e-5})


def test_a_sweep_holds_out_validation_rows_unless_the_user_chose_them():
    assert sweep.plan(BASE, {"grid": {"seed": [1, 2]}}).shared.validation_share == 0.1
    chosen = sweep.plan({**BASE, "validation_fraction": 0.2}, {"grid": {"seed": [1, 2]}})
    assert chosen.shared.validation_share == 0.2
    given = sweep.plan({**BASE, "validation_uri": "/data/dev.tsv"}, {"grid": {"seed": [1, 2]}})
    assert given.shared.validation_fraction is None and given.shared.validation_share == 0


def test_a_trial_whose_whole_config_is_invalid_is_named_with_the_field():
    # Each value is valid alone; trial 2's combination is not (accumulation needs custom).
    with pytest.raises(ConfigError) as err:
        sweep.plan({**BASE, "training_loop": "fit"}, {"grid": {"grad_accum_steps": [1, 2]}})
    assert err.value.field == "grad_accum_steps"
    assert "trial 2 (grad_accum_steps=2)" in str(err.value)
    assert "training_loop custom" in str(err.value)


@pytest.mark.parametrize("field", ["train_uri", "base_model", "provisioner", "model_name",
                                   "num_shards", "lower_case"])
def test_fields_every_trial_must_share_are_refused(field):
    value = {"num_shards": 2, "lower_case": False}.get(field, "x")
    with pytest.raises(ConfigError) as err:
        sweep.plan(BASE, {"grid": {field: [value]}})
    assert err.value.field == f"search_space.grid.{field}"
    assert "not sweepable" in str(err.value) and "learning_rate" in str(err.value)


@pytest.mark.parametrize("field", ["learning_rate", "per_replica_batch_size", "epochs",
                                   "warmup_ratio", "weight_decay", "seed", "max_seq_length"])
def test_the_issue_s_fields_are_sweepable(field):
    assert field in sweep.SWEEPABLE


@pytest.fixture
def sweep_folders(artifact_root):
    plan = sweep.plan(BASE, {"grid": {"max_seq_length": [32, 16], "learning_rate": [3e-5, 5e-5]}})
    ctx = RunContext(artifact_root, "bert_sweep", "exp__2026-10-01", "backfill__x", "exp")
    out = sweep.init_sweep(plan, ctx, max_parallel_trials=2)
    return ctx, out


def test_init_writes_the_sweep_and_every_trial_as_run_folders(sweep_folders):
    ctx, out = sweep_folders
    assert out["sweep_uri"] == ctx.run_uri
    assert [t["run_uri"] for t in out["trials"]] == [
        join_uri(ctx.artifact_root, "runs", "bert_sweep", f"exp__2026-10-01__trial-0{i}")
        for i in (1, 2, 3, 4)]
    for trial in out["trials"]:
        cfg, tctx = runlayout.load_run(trial["run_uri"])
        assert (tctx.experiment, tctx.run_id) == ("exp", "backfill__x")
    cfg, _ = runlayout.load_run(out["trials"][2]["run_uri"])
    assert (cfg.max_seq_length, cfg.learning_rate) == (16, 3e-5)
    record = sweep.read_sweep(ctx.run_uri)
    assert record["max_parallel_trials"] == 2 and record["metric"] == "accuracy"


def test_data_is_shared_with_every_trial_and_tokens_within_a_length(sweep_folders):
    ctx, out = sweep_folders
    runlayout.write_manifest(ctx.step_uri("data"), {"splits": "the sweep's"})
    leads = sweep.share_data(ctx.run_uri)
    trials = [t["run_uri"] for t in out["trials"]]
    assert leads == [{"run_uri": trials[0], "label": "max_seq_length=32"},
                     {"run_uri": trials[2], "label": "max_seq_length=16"}]
    for run in trials:
        assert storage.read_json(join_uri(run, "data", "manifest.json")) == {
            "splits": "the sweep's"}
    for lead, length in ((trials[0], 32), (trials[2], 16)):
        runlayout.write_manifest(join_uri(lead, "tokenize"), {"max_seq_length": length})
    assert sweep.share_tokens(ctx.run_uri) == [
        {"run_uri": t["run_uri"], "label": t["label"]} for t in out["trials"]]
    assert [storage.read_json(join_uri(r, "tokenize", "manifest.json"))["max_seq_length"]
            for r in trials] == [32, 32, 16, 16]


def _trained(run_uri: str, value: float, metric: str = "accuracy", **validation) -> None:
    """A trial's train manifest with the validation figure of the weights it saved."""
    runlayout.write_manifest(join_uri(run_uri, "train"), {"steps": 10, "validation": {
        "metric": metric, "exported_value": value, "best_step": 10, "stopped_early": False,
        "pruned": None, **validation}})


def test_the_best_validated_trial_wins_and_a_tie_goes_to_the_first(sweep_folders):
    ctx, out = sweep_folders
    runs = [t["run_uri"] for t in out["trials"]]
    _trained(runs[1], 0.8)
    _trained(runs[2], 0.9, stopped_early=True)  # early stopping ends a trial normally
    _trained(runs[3], 0.9)  # trial 1 failed: no train manifest
    # A test figure never decides: even a higher one on a trial that validates worse.
    runlayout.write_manifest(join_uri(runs[1], "evaluate"), {"metrics": {"accuracy": 0.99}})
    result = sweep.pick_best(ctx.run_uri)
    assert result["best"]["index"] == 3 and result["best"]["run_uri"] == runs[2]
    assert result["ranked_on"] == "validation"
    assert [r["ranked"] for r in result["trials"]] == [False, True, True, True]
    assert storage.read_json(join_uri(ctx.run_uri, "best", "manifest.json")) == result


def test_a_pruned_trial_never_wins(sweep_folders):
    ctx, out = sweep_folders
    runs = [t["run_uri"] for t in out["trials"]]
    _trained(runs[0], 0.95, pruned="pruned at step 4: accuracy 0.95 is below the median")
    _trained(runs[1], 0.7)
    result = sweep.pick_best(ctx.run_uri)
    assert result["best"]["index"] == 2
    assert result["trials"][0]["pruned"].startswith("pruned at step 4")


def test_no_ranked_trial_is_an_error_naming_the_sweep(sweep_folders):
    ctx, _ = sweep_folders
    with pytest.raises(BertflowError, match="no trial of the sweep .* trained to its end"):
        sweep.pick_best(ctx.run_uri)


def test_pruning_needs_validation_during_training_in_every_trial():
    with pytest.raises(ConfigError) as err:
        sweep.plan(BASE, {"grid": {"seed": [1, 2]}}, pruning="median")
    assert err.value.field == "sweep_pruning" and "set eval_every_steps" in str(err.value)
    plan = sweep.plan({**BASE, "eval_every_steps": 1}, {"grid": {"seed": [1, 2]}}, "asha")
    assert plan.pruning == "asha"
    with pytest.raises(ConfigError, match="not one of none, median, asha"):
        sweep.plan(BASE, {"grid": {"seed": [1, 2]}}, pruning="hyperband")


@pytest.mark.parametrize("cap", [1, 2, 3])
def test_the_slot_rule_never_lets_more_than_the_cap_run(cap):
    """Random orders of asking, finishing, and trials that end without ever starting (their
    wait failed): never more than `cap` trials started and not finished, and no deadlock."""
    rng = random.Random(cap)
    peaks = set()
    for _ in range(300):
        n = rng.randint(1, 9)
        waiting, running, ended, peak = set(range(1, n + 1)), set(), set(), 0
        while waiting or running:
            roll = rng.random()
            if waiting and roll < 0.1:  # a wait that fails: the trial ends, never started
                index = rng.choice(sorted(waiting))
                waiting.discard(index)
                ended.add(index)
            elif waiting and (not running or roll < 0.6):
                index = rng.choice(sorted(waiting))
                if sweep.may_start(index, len({i for i in ended if i < index}), cap):
                    waiting.discard(index)
                    running.add(index)
                    peak = max(peak, len(running))
            elif running:
                index = rng.choice(sorted(running))
                running.discard(index)
                ended.add(index)
            if waiting and not running and not any(
                    sweep.may_start(i, len({e for e in ended if e < i}), cap) for i in waiting):
                pytest.fail(f"deadlock: {sorted(waiting)} wait with {sorted(ended)} ended")
        assert peak <= cap
        peaks.add(peak)
    assert cap in peaks  # the cap is reached, not only respected


@pytest.mark.parametrize("task, metric, other", [("regression", "pearson", "spearman"),
                                                 ("token_classification", "f1", "macro_f1"),
                                                 ("multi_label", "micro_f1", "macro_f1")])
def test_a_sweep_of_any_task_picks_its_best_by_the_tasks_gate_metric(artifact_root, task,
                                                                    metric, other):
    """A sweep runs one task (task is not sweepable: the trials share the data); its best
    trial is the one with the best gate metric of that task: pearson for regression, entity
    F1 for token classification, micro-F1 for multi-label."""
    plan = sweep.plan({**BASE, "task": task}, {"grid": {"seed": [1, 2]}})
    ctx = RunContext(artifact_root, "bert_sweep", task, f"manual__{task}", task)
    out = sweep.init_sweep(plan, ctx, max_parallel_trials=1)
    assert sweep.read_sweep(ctx.run_uri)["metric"] == metric
    for trial, value in zip(out["trials"], (0.7, 0.8)):
        _trained(trial["run_uri"], value, metric)
    best = sweep.pick_best(ctx.run_uri)["best"]
    assert best["index"] == 2 and best["validation"] == 0.8
    with pytest.raises(ConfigError, match="not sweepable"):
        sweep.plan(BASE, {"grid": {"task": ["regression"]}})
