"""Training recipes (issue 48): the learning-rate schedules and label smoothing. The shapes are
checked at points where transformers' get_scheduler formulas give round values; the smoothed
loss against cross-entropy with smoothed targets computed in numpy; and a real train step
shows that each setting reaches training under both loops."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tasks.config import RunConfig
from tasks.training import model
from train_helpers import make_run, saved_weights, tiny_model_dir  # noqa: F401


@pytest.mark.parametrize("shape, expected", [
    # steps 0, 5 (warm-up), 10 (peak), 35 (a quarter of the decay), 60 (half), 110 (end), 200
    ("linear", [0, 0.5, 1, 0.75, 0.5, 0, 0]),
    ("cosine", [0, 0.5, 1, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0, 0]),
    ("polynomial", [0, 0.5, 1, 0.75 ** 2, 0.25, 0, 0]),
    ("constant_with_warmup", [0, 0.5, 1, 1, 1, 1, 1]),
])
def test_each_schedule_warms_up_then_takes_its_shape(shape, expected):
    schedule = model.WarmUpSchedule(1.0, warmup_steps=10, total_steps=110, shape=shape,
                                    power=2.0)
    values = [float(schedule(step)) for step in (0, 5, 10, 35, 60, 110, 200)]
    assert values == pytest.approx(expected, abs=1e-6)


def test_constant_has_no_warm_up_and_the_plan_records_the_recipe():
    cfg = RunConfig(lr_schedule="constant", warmup_ratio=0.1, label_smoothing=0.1)
    plan = model.make_plan(cfg, 1000, 1)
    assert plan.warmup_steps == 0 and plan.total_steps > 0
    schedule = model.WarmUpSchedule(2.0, plan.warmup_steps, plan.total_steps, "constant")
    assert [float(schedule(s)) for s in (0, plan.total_steps)] == [2.0, 2.0]
    recorded = plan.to_dict()
    assert (recorded["lr_schedule"], recorded["label_smoothing"]) == ("constant", 0.1)
    cosine = model.make_plan(RunConfig(lr_schedule="cosine"), 1000, 1)
    assert cosine.warmup_steps == int(cosine.total_steps * 0.1) > 0


def _numpy_smoothed(labels, logits, s):
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    k = logits.shape[-1]
    target = (1 - s) * np.eye(k)[labels] + s / k
    return -(target * logp).sum(-1)


def test_smoothed_cross_entropy_is_cross_entropy_against_smoothed_labels():
    import tensorflow as tf

    from tasks.task_kinds import kind, smoothed_cross_entropy

    rng = np.random.default_rng(0)
    logits = rng.normal(size=[6, 4]).astype(np.float32) * 3
    labels = np.array([0, 3, 1, 2, 2, 0])
    got = smoothed_cross_entropy(tf.constant(labels), tf.constant(logits), 0.1).numpy()
    np.testing.assert_allclose(got, _numpy_smoothed(labels, logits, 0.1), rtol=1e-5)
    plain = smoothed_cross_entropy(tf.constant(labels), tf.constant(logits)).numpy()
    np.testing.assert_allclose(plain, _numpy_smoothed(labels, logits, 0.0), rtol=1e-5)
    assert (got != plain).all()
    # The Keras loss fit compiles (labels as the TFRecords give them, [batch]).
    keras_loss = kind("classification").keras_loss(label_smoothing=0.1)
    assert float(keras_loss(labels, logits)) == pytest.approx(got.mean(), rel=1e-5)


def test_token_smoothing_scores_labelled_pieces_only():
    import tensorflow as tf

    from tasks.task_kinds import IGNORED, kind, masked_token_losses

    rng = np.random.default_rng(1)
    logits = rng.normal(size=[2, 5, 3]).astype(np.float32)
    labels = np.array([[IGNORED, 1, 2, IGNORED, IGNORED], [IGNORED, 0, 0, 1, IGNORED]])
    sums, counts = masked_token_losses(tf.constant(labels), tf.constant(logits), 0.2)
    labelled = labels != IGNORED
    per_piece = _numpy_smoothed(np.where(labelled, labels, 0), logits, 0.2) * labelled
    np.testing.assert_allclose(sums.numpy(), per_piece.sum(1), rtol=1e-5)
    assert counts.numpy().tolist() == [2.0, 3.0]
    batch_mean = float(kind("token_classification").keras_loss(label_smoothing=0.2)(
        labels, logits))
    assert batch_mean == pytest.approx(per_piece.sum() / 5, rel=1e-5)


def test_settings_that_would_be_ignored_are_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="label_smoothing applies to classification"):
        RunConfig(task="regression", label_smoothing=0.1)
    with pytest.raises(ValidationError, match="lr_power is the power of lr_schedule"):
        RunConfig(lr_schedule="cosine", lr_power=2.0)
    RunConfig(task="token_classification", label_smoothing=0.1, lr_schedule="polynomial",
              lr_power=2.0)


def test_schedule_and_smoothing_reach_both_training_loops(tmp_path, tiny_model_dir):  # noqa: F811
    """Cosine with label smoothing under fit and the custom loop: the logged learning rate
    follows the cosine at every recorded step, the two loops reach the same weights, and
    those differ from the same run without smoothing."""
    from pathlib import Path

    from tasks.runs.runlayout import read_manifest
    from tasks.steps import train

    weights = {}
    for name, loop, smoothing in (("fit", "fit", 0.2), ("custom", "custom", 0.2),
                                  ("plain", "custom", 0.0)):
        cfg, ctx = make_run(tmp_path / name, tiny_model_dir, training_loop=loop, epochs=2,
                            lr_schedule="cosine", label_smoothing=smoothing)
        train.run(cfg, ctx)
        manifest = read_manifest(ctx.manifest_uri("train"))
        assert (manifest["lr_schedule"], manifest["label_smoothing"]) == ("cosine", smoothing)
        schedule = model.WarmUpSchedule(manifest["learning_rate"], manifest["warmup_steps"],
                                        manifest["total_steps"], "cosine")
        history = json.loads((Path(ctx.step_uri("train")) / "history.json").read_text())
        records = history["records"]
        assert len(records) > 5 and [r["learning_rate"] for r in records] == pytest.approx(
            [float(schedule(r["step"])) for r in records], rel=1e-5)
        weights[name] = saved_weights(Path(manifest["model_dir"]))
    fit_custom = max(float(np.abs(weights["fit"][k] - weights["custom"][k]).max())
                     for k in weights["fit"])
    smoothed_plain = max(float(np.abs(weights["custom"][k] - weights["plain"][k]).max())
                         for k in weights["fit"])
    assert fit_custom <= 3e-4 < smoothed_plain
