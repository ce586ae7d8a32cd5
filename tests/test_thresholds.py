"""Thresholds tuned on the validation rows (issue 48; tasks/thresholds.py): the choice against
a brute force over the grid on the rows' probabilities, the in-graph counts against numpy,
the refusals, then real runs of the train and export steps on the tiny model: a multi-label
run whose validation rows are built so that tuning on the test rows would choose otherwise,
served by the SavedModel with the recorded vector, and a binary run tuned for accuracy."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tasks import thresholds
from tasks.config import RunConfig, parse_config
from tasks.errors import ConfigError
from train_helpers import (MULTI_LABELS, LABELS, VOCAB, make_run, tiny_model_dir,  # noqa: F401
                           tiny_rows, write_tfrecords)

GRID = np.asarray(thresholds.GRID)


def brute_force(probability, truth, metric="f1", min_positives=thresholds.MIN_POSITIVES):
    """Each column's threshold, from the rows themselves: the metric at every grid value by
    elementwise comparisons, the best (nearest 0.5 among equals, the lower first), or 0.5
    for a column with fewer than min_positives positives."""
    chosen = []
    for p, t in zip(np.asarray(probability).T, np.asarray(truth, bool).T):
        if t.sum() < min_positives:
            chosen.append(0.5)
            continue
        values = []
        for bound in GRID:
            guess = p > bound
            tp, fp = (guess & t).sum(), (guess & ~t).sum()
            fn, tn = (~guess & t).sum(), (~guess & ~t).sum()
            f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
            f1_negative = 2 * tn / (2 * tn + fp + fn) if tn + fp + fn else 0.0
            values.append({"f1": f1, "accuracy": (tp + tn) / len(t),
                           "macro_f1": (f1 + f1_negative) / 2}[metric])
        values = np.asarray(values)
        best = np.flatnonzero(values >= values.max() - 1e-12)
        chosen.append(float(GRID[best[np.argmin(np.abs(GRID[best] - 0.5))]]))
    return chosen


def numpy_counts(probability, truth):
    """threshold_counts' vector computed in numpy."""
    over = probability[:, :, None] > GRID.astype(np.float32)[None, None, :]
    truth = np.asarray(truth, bool)
    return np.concatenate([(over & truth[:, :, None]).sum(0).ravel(), over.sum(0).ravel(),
                           truth.sum(0), [len(truth)]])


def test_each_label_takes_its_own_best_threshold_and_rare_labels_fall_back():
    rng = np.random.default_rng(0)
    rows = 400
    truth = np.stack([rng.random(rows) < 0.5, rng.random(rows) < 0.15,
                      rng.random(rows) < 0.015], 1)
    # Label 0 is well separated, label 1 is not (its positives score lower), label 2 is rare.
    probability = np.clip(np.stack([
        0.35 + 0.3 * truth[:, 0] + 0.2 * rng.random(rows),
        0.05 + 0.2 * truth[:, 1] + 0.3 * rng.random(rows),
        rng.random(rows)], 1), 0, 1).astype(np.float32)
    names = ["a", "b", "rare"]
    record = thresholds.choose(numpy_counts(probability, truth), names)
    assert truth[:, 2].sum() < thresholds.MIN_POSITIVES <= truth[:, 1].sum()
    assert record["thresholds"] == brute_force(probability, truth)
    assert len(set(record["thresholds"])) == 3 and record["thresholds"][2] == 0.5
    rare = record["per_label"]["rare"]
    assert rare["fallback"] and rare["positives"] == int(truth[:, 2].sum())
    guess = probability[:, 2] > 0.5  # the rare label's F1 is reported at the fallback
    want = 2 * (guess & truth[:, 2]).sum() / (guess.sum() + truth[:, 2].sum())
    assert rare["validation_f1"] == pytest.approx(want, abs=1e-6)
    assert not record["per_label"]["a"]["fallback"]
    assert record["validation_rows"] == rows and record["split"] == "validation"


@pytest.mark.parametrize("metric", thresholds.BINARY_METRICS)
def test_a_binary_threshold_maximizes_the_chosen_metric(metric):
    rng = np.random.default_rng(1)
    truth = rng.random((300, 1)) < 0.3
    probability = np.clip(0.2 + 0.3 * truth + 0.45 * rng.random((300, 1)), 0, 1)
    record = thresholds.choose(numpy_counts(probability.astype(np.float32), truth), ["pos"],
                               metric, "decision_threshold")
    assert record["thresholds"] == brute_force(probability.astype(np.float32), truth, metric)
    assert record["metric"] == metric and f"validation_{metric}" in record["per_label"]["pos"]


def test_the_in_graph_counts_match_numpy():
    import tensorflow as tf

    from tasks.steps import evaluate
    from tasks.task_kinds import kind

    rng = np.random.default_rng(2)
    logits = rng.normal(size=[37, 3]).astype(np.float32) * 2
    truth = (rng.random([37, 3]) < 0.4).astype(np.float32)
    counts, zeros = evaluate.threshold_counts(kind("multi_label"), 3)
    got = counts(tf.constant(truth), tf.constant(logits)).numpy()
    want = numpy_counts(tf.sigmoid(logits).numpy(), truth)
    assert got.shape == zeros.shape and got.tolist() == want.tolist()

    two = rng.normal(size=[29, 2]).astype(np.float32)
    labels = rng.integers(0, 2, 29)
    counts, zeros = evaluate.threshold_counts(kind("classification"), 2)
    got = counts(tf.constant(labels), tf.constant(two)).numpy()
    positive = tf.nn.softmax(two).numpy()[:, 1:]
    assert got.shape == zeros.shape
    assert got.tolist() == numpy_counts(positive, labels[:, None] == 1).tolist()


def test_a_configured_decision_threshold_decides_serving_and_counting_alike():
    """decision_threshold 0.3 (not tuned): the served label and the evaluation's confusion
    matrix both take the second label where its softmax probability is over 0.3."""
    import tensorflow as tf

    from tasks.steps import evaluate
    from tasks.task_kinds import kind

    rng = np.random.default_rng(3)
    logits = rng.normal(size=[50, 2]).astype(np.float32)
    labels = rng.integers(0, 2, 50)
    positive = tf.nn.softmax(logits).numpy()[:, 1]
    assert ((positive > 0.3) & (positive < 0.5)).any()  # rows where argmax says otherwise
    served = kind("classification").serving_outputs_of(tf.constant(logits),
                                                       tf.constant(LABELS), 0.3)
    assert [x.decode() for x in served["label"].numpy()] == [
        LABELS[int(p > np.float32(0.3))] for p in positive]
    counts, _ = evaluate.confusion_counts(2, 0.3)
    want = np.zeros((2, 2), int)
    np.add.at(want, (labels, (positive > np.float32(0.3)).astype(int)), 1)
    assert counts(tf.constant(labels), tf.constant(logits)).numpy().tolist() == want.tolist()
    argmax = kind("classification").serving_outputs_of(tf.constant(logits),
                                                       tf.constant(LABELS), None)
    assert [x.decode() for x in argmax["label"].numpy()] == [
        LABELS[i] for i in logits.argmax(1)]
    cfg = RunConfig(decision_threshold=0.3)
    assert thresholds.for_evaluation(cfg, "classification", None) == 0.3
    assert thresholds.for_evaluation(RunConfig(), "classification", None) is None


@pytest.mark.parametrize("values, fragment", [
    ({"task": "multi_label", "multi_label_threshold": "tuned", "validation_fraction": 0},
     "multi_label_threshold tuned chooses on the validation rows, and this run has none: set "
     "validation_uri, or validation_fraction above 0"),
    ({"decision_threshold": "tuned", "validation_fraction": 0},
     "decision_threshold tuned chooses on the validation rows"),
    ({"multi_label_threshold": 0.3}, "multi_label_threshold applies to multi_label, not "
                                     "classification"),
    ({"task": "multi_label", "decision_threshold": 0.3}, "decision_threshold applies to "
                                                         "classification with two labels"),
    ({"labels": ["a", "b", "c"], "decision_threshold": "tuned"}, "and labels has 3"),
    ({"decision_threshold_metric": "accuracy"}, "set decision_threshold to tuned"),
    ({"task": "multi_label", "multi_label_threshold": "best"}, "a number over 0 and under 1, "
                                                              "or tuned"),
])
def test_thresholds_that_cannot_be_honoured_are_refused_with_the_fix(values, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(values)
    assert fragment in str(err.value)


def test_tuned_holds_out_validation_rows_and_flags_take_words_or_numbers():
    tuned = RunConfig(task="multi_label", multi_label_threshold="tuned")
    assert tuned.validation_share == 0.1 and RunConfig(task="multi_label").validation_share == 0
    assert RunConfig(task="multi_label", multi_label_threshold="tuned",
                     validation_uri="v.csv").validation_share == 0
    # The trigger form and the CLI send text: a number in it is a number.
    assert parse_config({"task": "multi_label", "multi_label_threshold": "0.3"}) \
        .multi_label_threshold == 0.3
    # The Param takes the word and numbers in the range, as Airflow validates it.
    import jsonschema

    from tasks.params_form import param_schemas

    schema = {k: v for k, v in param_schemas()["decision_threshold"].items()
              if k not in ("section", "title", "description", "default")}
    assert schema["type"] == ["number", "string"]
    for value in ("tuned", 0.3):
        jsonschema.validate(value, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(1.5, schema)


def test_the_train_step_refuses_tuned_without_a_validation_split(
        tmp_path, tiny_model_dir):  # noqa: F811
    from tasks.steps import train

    cfg, ctx = make_run(tmp_path, tiny_model_dir, task="multi_label",
                        multi_label_threshold="tuned", num_validation=0)
    with pytest.raises(ConfigError, match="this run's data has no validation split: set "
                                          "validation_uri or validation_fraction"):
        train.run(cfg, ctx)
    assert not (Path(ctx.step_uri("train")) / "model").exists()
    # labels empty at validate, three in the data: refused before any model loads
    with pytest.raises(ConfigError, match="applies to two labels; this run's data has 3"):
        train.check_thresholds(RunConfig(decision_threshold=0.4),
                               {"splits": {}, "labels": ["a", "b", "c"]})


# --- real runs ----------------------------------------------------------------------------
def texts_of(rows) -> list[str]:
    """The tiny rows as the raw text the SavedModel takes (each word one vocabulary entry)."""
    return [" ".join(VOCAB[i] for i in ids[1:-1]) for ids, _, _ in rows]


def export_run(cfg, ctx, task: str, labels: list[str]) -> str:
    """The manifests export reads besides train's, as the data and evaluate steps write
    them; then the export step. The version folder."""
    from tasks.io import storage
    from tasks.runs import runlayout
    from tasks.steps import export

    trained = runlayout.read_manifest(ctx.manifest_uri("train"))
    runlayout.write_manifest(ctx.step_uri("data"), {
        "task": task, "labels": labels, "has_pair": False,
        "sources": {"train": {"uri": "train.jsonl", "sha256": "ab" * 32}, "eval": None}})
    runlayout.write_manifest(ctx.step_uri("evaluate"), {
        "metrics_uri": trained["evaluation"]["metrics_uri"], "num_examples": 1})
    version = runlayout.read_manifest(export.run(cfg, ctx))["version_uri"]
    assert storage.exists(f"{version}/saved_model/saved_model.pb")
    return version


def serve(version: str, texts: list[str]) -> dict:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the tokenizer's ops)

    out = tf.saved_model.load(f"{version}/saved_model").signatures["serving_default"](
        text=tf.constant(texts))
    return {k: v.numpy() for k, v in out.items()}


def replace_split(ctx, split: str, rows) -> None:
    """Rewrite one split's shards (the manifest's paths, one shard) with `rows`."""
    from tasks.runs import runlayout

    tok = runlayout.read_manifest(ctx.manifest_uri("tokenize"))
    shards = tok["splits"][split]["shards"]
    write_tfrecords(Path(shards[0]), rows)
    for extra in shards[1:]:
        write_tfrecords(Path(extra), [])
    tok["splits"][split]["num_examples"] = len(rows)
    runlayout.write_manifest(ctx.step_uri("tokenize"), tok)


def test_multi_label_thresholds_come_from_validation_rows_and_are_served(
        tmp_path, tiny_model_dir):  # noqa: F811
    """The validation rows keep the words but not the labels the test rows have: `upper` on
    every row (F1 1 below the lowest probability; on the test rows, only rows with upper
    words have it), `lower` on 6 rows only (under MIN_POSITIVES: it falls back). The recorded
    vector is the brute force on the validation rows' served probabilities, not on the test
    rows'; the test metrics and the SavedModel use it, and the HF config records it."""
    from tasks.io import storage
    from tasks.runs.runlayout import read_manifest
    from tasks.steps import train

    cfg, ctx = make_run(tmp_path, tiny_model_dir, task="multi_label", num_validation=60,
                        multi_label_threshold="tuned", model_name="tuned")
    validation = tiny_rows(60, 3, task="multi_label")
    kept = 0
    for i, (ids, types, label) in enumerate(validation):
        lower = label[0] if kept < 6 else 0.0
        kept += int(lower)
        validation[i] = (ids, types, [lower, 1.0])
    replace_split(ctx, "validation", validation)
    test_rows = tiny_rows(41, 2, task="multi_label")  # make_run's test split

    train.run(cfg, ctx)
    record = read_manifest(ctx.manifest_uri("train"))["thresholds"]
    version = export_run(cfg, ctx, "multi_label", MULTI_LABELS)
    on_validation = serve(version, texts_of(validation))["probabilities"]
    on_test = serve(version, texts_of(test_rows))
    truth = np.array([label for _, _, label in validation])
    test_truth = np.array([label for _, _, label in test_rows]) > 0.5

    vector = record["thresholds"]
    assert vector == brute_force(on_validation, truth)
    assert vector != brute_force(on_test["probabilities"], test_truth)
    assert record["per_label"]["lower"] == {**record["per_label"]["lower"], "fallback": True,
                                            "positives": 6, "threshold": 0.5}
    assert vector[1] != 0.5 and not record["per_label"]["upper"]["fallback"]

    # Served: the labels over each label's own threshold, which 0.5 would not give.
    over = on_test["probabilities"] > np.asarray(vector, np.float32)
    want = [[n for n, on in zip(MULTI_LABELS, row) if on] for row in over]
    got = [[n.decode() for n in row if n] for row in on_test["labels"]]
    assert got == want
    assert (over != (on_test["probabilities"] > 0.5)).any()

    metrics = json.loads(storage.read_text(f"{version}/metrics.json"))
    assert metrics["threshold"] == vector
    tp = (over & test_truth).sum()
    assert metrics["micro_f1"] == pytest.approx(2 * tp / (over.sum() + test_truth.sum()))
    # The evaluate step, loading the saved weights itself, reads the vector too.
    from tasks.steps import evaluate

    alone = read_manifest(evaluate.run(cfg.model_copy(update={"evaluate_in_train": False}),
                                       ctx))
    assert alone["evaluated_in"] == "evaluate"
    again = json.loads(storage.read_text(alone["metrics_uri"]))
    assert (again["threshold"], again["micro_f1"]) == (vector, metrics["micro_f1"])
    config = json.loads(storage.read_text(f"{version}/config.json"))
    assert config["label_thresholds"] == dict(zip(MULTI_LABELS, vector))
    assert config["threshold_source"] == "tuned"
    card = storage.read_text(f"{version}/model_card.md")
    assert f"| upper | {vector[1]} |" in card and "| lower | 0.5 |" in card
    assert "| 6 | yes |" in card


def test_a_binary_decision_threshold_is_tuned_for_accuracy_and_served(
        tmp_path, tiny_model_dir):  # noqa: F811
    """Every validation row labelled `pos`: the accuracy-best threshold is below the rows'
    lowest `pos` probability (the largest such grid value: the nearest 0.5), not argmax's
    0.5; the SavedModel's label follows it on texts of mixed words."""
    import random

    from tasks.io import storage
    from tasks.runs.runlayout import read_manifest
    from tasks.steps import train

    cfg, ctx = make_run(tmp_path, tiny_model_dir, num_validation=40, epochs=1,
                        decision_threshold="tuned", decision_threshold_metric="accuracy",
                        model_name="binary")
    validation = [(ids, types, 1) for ids, types, _ in tiny_rows(40, 3)]
    replace_split(ctx, "validation", validation)
    train.run(cfg, ctx)
    record = read_manifest(ctx.manifest_uri("train"))["thresholds"]
    assert record["param"] == "decision_threshold" and record["positive_label"] == "pos"
    version = export_run(cfg, ctx, "classification", LABELS)
    served = serve(version, texts_of(validation))
    chosen = record["thresholds"][0]
    assert record["thresholds"] == brute_force(served["probabilities"][:, 1:],
                                               np.ones((40, 1), bool), "accuracy")
    assert chosen < 0.5 and record["per_label"]["pos"]["validation_accuracy"] == 1.0
    config = json.loads(storage.read_text(f"{version}/config.json"))
    assert (config["decision_threshold"], config["decision_positive_label"]) == (chosen, "pos")

    rng = random.Random(7)
    texts = [" ".join(VOCAB[rng.randrange(5, len(VOCAB))] for _ in range(rng.randint(1, 6)))
             for _ in range(200)]
    served = serve(version, texts)
    positive = served["probabilities"][:, 1]
    want = np.where(positive > np.float32(chosen), "pos", "neg")
    assert [x.decode() for x in served["label"]] == want.tolist()
    assert ((positive > chosen) & (positive < 0.5)).any()  # where argmax says neg
    # The test metrics count the served labels.
    test_rows = tiny_rows(41, 2)
    served = serve(version, texts_of(test_rows))
    matrix = np.zeros((2, 2), int)
    for (_, _, truth_id), name in zip(test_rows, served["label"]):
        matrix[truth_id, LABELS.index(name.decode())] += 1
    metrics = json.loads(storage.read_text(f"{version}/metrics.json"))
    assert metrics["confusion_matrix"] == matrix.tolist()
