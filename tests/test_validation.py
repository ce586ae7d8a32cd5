"""Evaluation on the validation rows during training (tasks/training/validation.py): the rule
that keeps the best state and stops early, on scripted figures; then real runs of the train
step on the tiny model: early stopping ends a stalled run and the best checkpoint, not the
last, is exported; the refusals that come before any model is loaded. Distributed runs and
exact resume across a SIGTERM: tests/test_token_strategies.py."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tasks.config import RunConfig
from tasks.errors import ConfigError
from tasks.runs.runlayout import read_manifest
from tasks.steps import evaluate, train
from tasks.training import checkpoint, inputs, validation
from train_helpers import LABELS, make_run, saved_weights, tiny_model_dir  # noqa: F401


@pytest.fixture(autouse=True)
def float32_policy_afterwards():
    yield
    import tf_keras

    tf_keras.mixed_precision.set_global_policy("float32")


def scripted(values: list[float], **settings):
    """A Validator whose evaluations return `values` in turn, over a one-weight model whose
    weight the test sets to the step before each evaluation."""
    import tf_keras

    model = tf_keras.Sequential([tf_keras.layers.Dense(1, use_bias=False)])
    model.build((None, 1))
    cfg = RunConfig(**{"eval_every_steps": 10, **settings})
    figures = iter(values)
    best = validation.BestState(model, tf.distribute.get_strategy(), cfg.keeps_best_checkpoint)
    return model, validation.Validator(cfg, lambda: {"accuracy": next(figures)}, model, best,
                                       total_steps=1000, steps_per_epoch=25)


def run_script(model, validator, steps):
    for step in steps:
        model.weights[0].assign([[float(step)]])
        validator.step_done(step)
        if validator.stopped:
            return step
    return None


def test_the_best_needs_more_than_min_delta_and_patience_counts_evaluations():
    model, validator = scripted([0.50, 0.60, 0.605, 0.62, 0.62, 0.615, 0.625, 0.99],
                                early_stopping_patience=3, early_stopping_min_delta=0.01)
    # Steps 5 and 15 are not evaluation steps (every 10): nothing is read for them.
    stopped = run_script(model, validator, [5, 10, 15, 20, 30, 40, 50, 60, 70])
    # 0.605 is not 0.01 above 0.60; 0.62 is: best at step 40, then 3 without improvement.
    assert stopped == 70
    summary = validator.finish()
    assert (summary["best_step"], summary["best_value"]) == (40, 0.62)
    assert summary["stopped_early"] and summary["exported"] == "best"
    assert summary["exported_value"] == 0.62
    assert model.weights[0].numpy()[0, 0] == 40.0  # the best step's weights, restored
    assert not validator.pending(80)  # a stopped run evaluates no more


def test_epoch_ends_and_the_last_step_are_evaluated_and_best_checkpoint_can_be_off():
    model, validator = scripted([0.7, 0.6, 0.5], eval_every_steps=0, eval_every_epoch=True,
                                best_checkpoint=False)
    assert [s for s in range(1, 1001) if validator.due(s)][:3] == [25, 50, 75]
    assert validator.due(1000)  # total_steps
    run_script(model, validator, [25, 50, 75])
    summary = validator.finish()
    assert summary["best_step"] == 25 and summary["exported"] == "last"
    assert summary["exported_value"] == 0.5  # the last evaluation's, not the best's
    assert model.weights[0].numpy()[0, 0] == 75.0  # the last weights stay


def test_early_stopping_ends_a_stalled_run_and_exports_the_best_steps_weights(
        tmp_path, tiny_model_dir):  # noqa: F811
    cfg, ctx = make_run(tmp_path, tiny_model_dir, num_validation=40, eval_every_steps=2,
                        checkpoint_every_steps=2, early_stopping_patience=2)
    train.run(cfg, ctx)
    manifest = read_manifest(ctx.manifest_uri("train"))
    result = manifest["validation"]
    best, steps, patience = result["best_step"], manifest["steps"], 2
    assert result["stopped_early"] and result["exported"] == "best"
    assert steps == best + patience * 2 < manifest["total_steps"] == 24
    history = json.loads((Path(ctx.step_uri("train")) / "history.json").read_text())
    assert [r["step"] for r in history["validation"]] == list(range(2, steps + 1, 2))
    assert history["best"]["best_step"] == best
    assert list((Path(manifest["tensorboard_dir"]) / "validation").glob("events.out.*"))

    # The exported weights are the best step's checkpoint's, not the last step's.
    exported = saved_weights(Path(manifest["model_dir"]))
    tok = read_manifest(ctx.manifest_uri("tokenize"))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")

    def weights_at(step):
        with strategy.scope():
            model = checkpoint.load_classifier(tiny_model_dir, LABELS)
        tf.train.Checkpoint(model=model).restore(
            str(Path(manifest["checkpoint_dir"]) / f"ckpt-{step}")).expect_partial()
        return model

    at_best, at_last = weights_at(best), weights_at(steps)
    with strategy.scope():
        served = checkpoint.load_classifier(Path(manifest["model_dir"]), LABELS)
    for ours, want, last in zip(served.weights, at_best.weights, at_last.weights):
        np.testing.assert_array_equal(ours.numpy(), want.numpy(), err_msg=ours.name)
    assert any(not np.array_equal(w.numpy(), v.numpy())
               for w, v in zip(at_best.weights, at_last.weights))
    assert len(exported) > 20
    # And they score on validation what the run recorded for that step.
    with inputs.local_shards(tok, "validation") as files:
        figures = evaluate.split_metrics(cfg, tok, strategy, "one_device", served, files,
                                         "validation")()
    assert figures["accuracy"] == result["best_value"]
    # The test evaluation after training (evaluate_in_train) scored the exported weights.
    metrics = json.loads(Path(manifest["evaluation"]["metrics_uri"]).read_text())
    with inputs.local_shards(tok, "eval") as files:
        again = evaluate.split_metrics(cfg, tok, strategy, "one_device", served, files)()
    assert metrics["confusion_matrix"] == again["confusion_matrix"]


def test_custom_loop_validates_every_epoch_without_stopping(tmp_path, tiny_model_dir):  # noqa: F811
    cfg, ctx = make_run(tmp_path, tiny_model_dir, num_validation=20, eval_every_epoch=True,
                        training_loop="custom", best_checkpoint=False)
    train.run(cfg, ctx)
    manifest = read_manifest(ctx.manifest_uri("train"))
    history = json.loads((Path(ctx.step_uri("train")) / "history.json").read_text())
    assert [r["step"] for r in history["validation"]] == [8, 16, 24]  # 8 steps per epoch
    assert manifest["steps"] == 24 and manifest["validation"]["exported"] == "last"
    assert manifest["validation"]["evaluations_this_attempt"] == 3


def test_a_run_that_cannot_validate_is_refused_before_the_model_loads(
        tmp_path, tiny_model_dir):  # noqa: F811
    cfg, ctx = make_run(tmp_path, tiny_model_dir, num_validation=20, eval_every_steps=30)
    with pytest.raises(ConfigError, match="more than the run's 24 steps"):
        train.run(cfg, ctx)
    cfg, ctx = make_run(tmp_path / "none", tiny_model_dir, eval_every_steps=4)
    with pytest.raises(ConfigError, match="no validation split"):
        train.run(cfg, ctx)
    assert not (Path(ctx.step_uri("train")) / "model").exists()
