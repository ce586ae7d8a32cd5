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


# --- class weights (tasks/class_weights.py) -------------------------------------------------
SPLIT = {"num_examples": 100, "label_counts": {"a": 80, "b": 15, "c": 5}}


def test_balanced_weights_follow_the_training_counts_for_each_task():
    from tasks import class_weights

    single = class_weights.for_run("balanced", "classification", ["a", "b", "c"], SPLIT)
    assert single == pytest.approx((100 / 240, 100 / 45, 100 / 15))
    # Every class contributes equally in total: count x weight is the same for each.
    assert {round(n * w, 9) for n, w in zip((80, 15, 5), single)} == {round(100 / 3, 9)}
    pos = class_weights.for_run("balanced", "multi_label", ["a", "b", "c"], SPLIT)
    assert pos == pytest.approx((20 / 80, 85 / 15, 95 / 5))  # negatives / positives
    given = class_weights.for_run('{"c": 4, "a": 1, "b": 2.5}', "token_classification",
                                  ["a", "b", "c"], SPLIT)
    assert given == (1.0, 2.5, 4.0)
    assert class_weights.for_run("none", "classification", ["a"], SPLIT) is None


@pytest.mark.parametrize("spec, fragment", [
    ('{"a": 1, "b": 2}', "has no weight for ['c']"),
    ('{"a": 1, "b": 2, "c": 1, "d": 1}', "names ['d'], not labels of"),
    ('{"a": 1, "b": 0, "c": 1}', "the weights of ['b'] are not positive"),
    ("heavy", "is not none, balanced or a JSON object"),
])
def test_a_bad_map_is_refused_naming_the_labels(spec, fragment):
    from tasks import class_weights
    from tasks.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        class_weights.for_run(spec, "classification", ["a", "b", "c"], SPLIT)
    assert err.value.field == "class_weights" and fragment in str(err.value)


def test_class_weights_are_checked_at_validate_where_the_labels_are_known():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"has no weight for \['neg'\]"):
        RunConfig(labels=["neg", "pos"], class_weights='{"pos": 2}')
    with pytest.raises(ValidationError, match="not regression"):
        RunConfig(task="regression", class_weights="balanced")
    with pytest.raises(ValidationError, match="is not none, balanced"):
        RunConfig(class_weights="[1, 2]")


def test_the_data_step_refuses_a_map_before_writing_anything(tmp_path):
    from tasks.errors import ConfigError
    from tasks.runs.runlayout import RunContext
    from tasks.steps import data

    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\n" + "".join(f"row {i}\t{'xyz'[i % 3]}\n" for i in range(30)))
    cfg = RunConfig(train_uri=str(train), class_weights='{"x": 1, "y": 2, "w": 3}',
                    artifact_root=str(tmp_path / "art"))
    ctx = RunContext(str(tmp_path / "art"), "dag", "weights")
    with pytest.raises(ConfigError) as err:
        data.run(cfg, ctx)
    assert "names ['w'], not labels of " + str(train) in str(err.value)
    assert "has no weight for ['z']" in str(err.value)
    assert not (tmp_path / "art" / "runs" / "dag" / "weights" / "data").exists()


def test_weighted_losses_against_numpy():
    import tensorflow as tf

    from tasks.task_kinds import IGNORED, kind, masked_token_losses

    rng = np.random.default_rng(2)
    weights = (0.5, 2.0, 3.0)
    logits = rng.normal(size=[5, 3]).astype(np.float32)
    labels = np.array([0, 1, 2, 2, 1])
    loss = kind("classification").keras_loss(class_weights=weights, label_smoothing=0.1)
    expected = _numpy_smoothed(labels, logits, 0.1) * np.array(weights)[labels]
    assert float(loss(labels, logits)) == pytest.approx(expected.mean(), rel=1e-5)

    hot = (rng.random([5, 3]) > 0.5).astype(np.float32)
    p = 1 / (1 + np.exp(-logits))
    bce = -(np.array(weights) * hot * np.log(p) + (1 - hot) * np.log(1 - p))
    pos = kind("multi_label").keras_loss(class_weights=weights)
    assert float(pos(hot, logits)) == pytest.approx(bce.mean(), rel=1e-5)

    tags = np.array([[IGNORED, 2, 0], [1, IGNORED, IGNORED]])
    token_logits = rng.normal(size=[2, 3, 3]).astype(np.float32)
    sums, counts = masked_token_losses(tf.constant(tags), tf.constant(token_logits), 0.0,
                                       weights)
    labelled = tags != IGNORED
    safe = np.where(labelled, tags, 0)
    per_piece = _numpy_smoothed(safe, token_logits, 0.0) * np.array(weights)[safe] * labelled
    np.testing.assert_allclose(sums.numpy(), per_piece.sum(1), rtol=1e-5)
    assert counts.numpy().tolist() == [2.0, 1.0]


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_balanced_weights_reach_training(tmp_path, tiny_model_dir, loop):  # noqa: F811
    """The train step reads the data manifest's counts: the plan records the weights, and
    the weights change what training reaches."""
    from pathlib import Path

    from tasks.runs.runlayout import read_manifest, write_manifest
    from tasks.steps import train
    from train_helpers import LABELS

    weights = {}
    for spec in ("balanced", "none"):
        cfg, ctx = make_run(tmp_path / spec, tiny_model_dir, training_loop=loop, epochs=1,
                            class_weights=spec)
        write_manifest(ctx.step_uri("data"), {"splits": {"train": {
            "num_examples": 128, "label_counts": {LABELS[0]: 96, LABELS[1]: 32}}}})
        train.run(cfg, ctx)
        manifest = read_manifest(ctx.manifest_uri("train"))
        weights[spec] = saved_weights(Path(manifest["model_dir"]))
        expected = [128 / (2 * 96), 128 / (2 * 32)] if spec == "balanced" else None
        assert manifest["class_weights"] == (pytest.approx(expected) if expected else None)
    assert max(float(np.abs(weights["balanced"][k] - weights["none"][k]).max())
               for k in weights["none"]) > 1e-4


# --- freeze ---------------------------------------------------------------------------------
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_frozen_weights_stay_as_the_checkpoint_has_them(tmp_path, tiny_model_dir,  # noqa: F811
                                                        loop):
    from pathlib import Path

    from tasks.runs.runlayout import read_manifest
    from tasks.steps import train

    cfg, ctx = make_run(tmp_path, tiny_model_dir, training_loop=loop, epochs=1,
                        freeze="embeddings+1", weight_decay=0.01)
    train.run(cfg, ctx)
    manifest = read_manifest(ctx.manifest_uri("train"))
    before, after = saved_weights(tiny_model_dir), saved_weights(Path(manifest["model_dir"]))
    frozen = [k for k in before if "embeddings" in k or ".layer.0." in k]
    trained = [k for k in before if ".layer.1." in k]
    assert frozen and trained and len(frozen) + len(trained) < len(before)
    assert all(np.array_equal(before[k], after[k]) for k in frozen)
    assert all(not np.array_equal(before[k], after[k]) for k in trained)
    assert manifest["freeze"] == {"setting": "embeddings+1", "frozen_weights": sum(
        before[k].size for k in frozen)}


def test_freezing_more_layers_than_the_model_has_is_refused(tmp_path, tiny_model_dir):  # noqa: F811
    from pydantic import ValidationError

    from tasks.errors import ConfigError
    from tasks.steps import train, validate

    train_file = tmp_path / "train.tsv"
    train_file.write_text("text\tlabel\n" + "".join(f"w{i}\t{i % 2}\n" for i in range(20)))
    with pytest.raises(ConfigError, match=r"the checkpoint has 2 layers; freeze at most "
                                          r"embeddings\+2"):
        validate.check_inputs_and_model(RunConfig(
            base_model=str(tiny_model_dir), train_uri=str(train_file), freeze="embeddings+3",
            artifact_root=str(tmp_path / "art")))
    cfg, ctx = make_run(tmp_path / "run", tiny_model_dir, freeze="embeddings+3")
    with pytest.raises(ConfigError, match="cannot freeze 3 layers of a 2-layer encoder"):
        train.run(cfg, ctx)
    with pytest.raises(ValidationError, match="freeze"):
        RunConfig(freeze="layers+2")


# --- layer-wise learning-rate decay and the head's rate -------------------------------------
def test_each_variable_takes_its_layer_s_factor():
    factor = model.lr_multiplier(RunConfig(layer_lr_decay=0.5, head_learning_rate=1e-3,
                                           learning_rate=1e-4), num_layers=3)
    names = {"m/bert/embeddings/word_embeddings:0": 0.125, "m/bert/block_0/q/kernel:0": 0.25,
             "m/bert/block_1/q/kernel:0": 0.5, "m/bert/block_2/q/kernel:0": 1.0,
             "m/bert/pooler/kernel:0": 1.0, "m/head/classifier/kernel:0": 10.0}
    assert {n: factor(n) for n in names} == pytest.approx(names)
    assert model.lr_multiplier(RunConfig(), 3) is None


@pytest.mark.parametrize("cpu_kernel", [False, True], ids=["tf_kernels", "bertflow_kernel"])
def test_the_first_step_moves_each_weight_by_its_own_rate(cpu_kernel):
    """Adam's first step moves a weight by about lr (m_hat / sqrt(v_hat) = sign(g)): with
    layer_lr_decay 0.5 over 2 layers and a head rate of 4x, dense and sparse (the embedding's
    IndexedSlices) gradients alike, on both kernels."""
    import tensorflow as tf

    from tasks.model import cpu_kernels
    if cpu_kernel and not cpu_kernels.available():
        pytest.fail("bertflow CPU kernels not built: run `make install`")

    cfg = RunConfig(learning_rate=0.01, layer_lr_decay=0.5, head_learning_rate=0.04,
                    weight_decay=0.0, lr_schedule="constant")
    plan = model.make_plan(cfg, 100, 1)
    optimizer = model.create_optimizer(cfg, plan, "float32", cpu_kernel=cpu_kernel,
                                       num_layers=2)
    names = {"c/bert/embeddings/word_embeddings": 0.25, "c/bert/block_0/dense/kernel": 0.5,
             "c/bert/block_1/dense/kernel": 1.0, "c/head/classifier/kernel": 4.0}
    variables = {n: tf.Variable(tf.zeros([4, 2]), name=n) for n in names}
    grads = []
    for name, var in variables.items():
        if "embeddings" in name:  # rows 1 and 3, as an embedding gather gives them
            grads.append((tf.IndexedSlices(tf.ones([2, 2]), tf.constant([1, 3]),
                                           tf.constant([4, 2])), var))
        else:
            grads.append((tf.ones([4, 2]), var))
    optimizer.apply_gradients(grads)
    for name, var in variables.items():
        moved = -var.numpy()
        rows = [1, 3] if "embeddings" in name else [0, 1, 2, 3]
        np.testing.assert_allclose(moved[rows], 0.01 * names[name], rtol=1e-4)


def test_layer_rates_reach_training_and_the_manifest(tmp_path, tiny_model_dir):  # noqa: F811
    from pathlib import Path

    from tasks.runs.runlayout import read_manifest
    from tasks.steps import train

    weights = {}
    for name, decay in (("decayed", 0.1), ("flat", 1.0)):
        cfg, ctx = make_run(tmp_path / name, tiny_model_dir, training_loop="custom", epochs=1,
                            layer_lr_decay=decay, head_learning_rate=2e-2)
        train.run(cfg, ctx)
        manifest = read_manifest(ctx.manifest_uri("train"))
        assert (manifest["layer_lr_decay"], manifest["head_learning_rate"]) == (decay, 2e-2)
        weights[name] = saved_weights(Path(manifest["model_dir"]))
    base = saved_weights(tiny_model_dir)
    key = next(k for k in base if "embeddings.word_embeddings" in k)
    moved = {n: float(np.abs(w[key] - base[key]).max()) for n, w in weights.items()}
    assert 0 < moved["decayed"] < moved["flat"] / 3


# --- loss_normalizer (tasks/training/token_loss.py) ------------------------------------
def test_the_dataset_normalizer_divides_each_row_by_a_fixed_count():
    """TokenCrossEntropy (fit's loss): with pieces_per_row each row's sum over that count,
    whatever the batch's labelled pieces; without it, the mean over the batch's pieces. The
    batch normalizer makes a batch's weight independent of its pieces (what grouping by
    length then skews); the fixed count keeps each piece's."""
    import tensorflow as tf

    from tasks.task_kinds import IGNORED, kind as task_kind

    X = IGNORED
    labels = tf.constant([[X, 1, 2, X], [X, 0, X, X]])
    logits = tf.constant(np.random.default_rng(0).normal(0, 2, (2, 4, 3)), tf.float32)
    sums = task_kind("token_classification").keras_loss(
        reduction="none", pieces_per_row=1.0)(labels, logits).numpy()
    fixed = task_kind("token_classification").keras_loss(pieces_per_row=2.5)
    batch = task_kind("token_classification").keras_loss()
    assert float(fixed(labels, logits)) == pytest.approx(sums.sum() / (2 * 2.5), rel=1e-6)
    assert float(batch(labels, logits)) == pytest.approx(sums.sum() / 3, rel=1e-6)
    # One more labelled piece in the batch: the fixed count does not move.
    more = tf.constant([[X, 1, 2, X], [X, 0, 1, X]])
    sums_more = task_kind("token_classification").keras_loss(
        reduction="none", pieces_per_row=1.0)(more, logits).numpy()
    assert float(fixed(more, logits)) == pytest.approx(sums_more.sum() / 5, rel=1e-6)


def test_the_dataset_normalizer_is_refused_outside_token_classification():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="loss_normalizer applies to "
                                              "token_classification, not multi_label"):
        RunConfig(task="multi_label", loss_normalizer="dataset")


def test_the_dataset_normalizer_reaches_both_loops_and_the_manifest(
        tmp_path, tiny_model_dir):  # noqa: F811
    """The train step reads the labelled words per row from the data manifest and both loops
    train with it; the custom loop's weights differ from the batch normalizer's. (Fit and the
    custom loop do not reach the same weights on per-token tasks with either normalizer: fit
    averages each replica's own count.)"""
    from pathlib import Path

    from tasks.runs.runlayout import read_manifest, write_manifest
    from tasks.steps import train
    from train_helpers import TAGS

    weights = {}
    for name, loop, normalizer in (("fit", "fit", "dataset"), ("custom", "custom", "dataset"),
                                   ("batch", "custom", "batch")):
        cfg, ctx = make_run(tmp_path / name, tiny_model_dir, training_loop=loop, epochs=1,
                            task="token_classification", loss_normalizer=normalizer)
        write_manifest(ctx.step_uri("data"), {"splits": {"train": {
            "num_examples": 128, "label_counts": {TAGS[0]: 900, TAGS[1]: 200, TAGS[2]: 180}}}})
        train.run(cfg, ctx)
        manifest = read_manifest(ctx.manifest_uri("train"))
        expected = 1280 / 128 if normalizer == "dataset" else None
        assert manifest["pieces_per_row"] == (pytest.approx(expected) if expected else None)
        assert math.isfinite(manifest["final_loss"])
        weights[name] = saved_weights(Path(manifest["model_dir"]))
    assert max(float(np.abs(weights["custom"][k] - weights["batch"][k]).max())
               for k in weights["batch"]) > 1e-6


def test_the_model_card_states_the_layer_rates_as_trained():
    """The head's peak after lr_scaling (the manifest's learning_rate is the scaled one), and
    polynomial's power next to the schedule."""
    from tasks.steps.export import layer_rates_line, schedule_line

    assert layer_rates_line({"layer_lr_decay": 1.0, "head_learning_rate": None}) == \
        "none (one rate for every layer)"
    scaled = {"layer_lr_decay": 0.8, "head_learning_rate": 3e-4, "learning_rate": 2e-4,
              "base_learning_rate": 1e-4}
    assert layer_rates_line(scaled) == "x0.8 per layer down from the top; head 0.0006"
    assert layer_rates_line({**scaled, "layer_lr_decay": 1.0}) == "no layer decay; head 0.0006"
    assert schedule_line({"lr_schedule": "cosine", "warmup_steps": 7}) == "cosine, 7 warm-up steps"
    assert schedule_line({"lr_schedule": "polynomial", "lr_power": 2.0, "warmup_steps": 0}) == \
        "polynomial (power 2.0), 0 warm-up steps"
