"""Evaluation metrics (pure numpy) and exact counting over the whole eval split."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tasks.training import checkpoint, inputs
from tasks.steps import evaluate
from train_helpers import (LABELS, tiny_model_dir, tiny_rows, write_tfrecords,  # noqa: F401
                           write_tiny_model)


def test_metrics_against_hand_computed_values():
    # rows: true a, b, c; columns: predicted a, b, c. c never occurs but is predicted once.
    m = evaluate.classification_metrics([[5, 1, 0], [2, 3, 1], [0, 0, 0]], ["a", "b", "c"])
    assert m["num_examples"] == 12
    assert m["accuracy"] == pytest.approx(8 / 12)
    a, b, c = (m["per_class"][k] for k in "abc")
    assert (a["precision"], a["recall"], a["support"]) == (pytest.approx(5 / 7),
                                                           pytest.approx(5 / 6), 6)
    assert a["f1"] == pytest.approx(10 / 13)
    assert (b["precision"], b["recall"], b["f1"]) == (0.75, 0.5, pytest.approx(0.6))
    assert c == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert m["macro_f1"] == pytest.approx((10 / 13 + 0.6) / 3)
    assert m["confusion_matrix"] == [[5, 1, 0], [2, 3, 1], [0, 0, 0]]
    assert m["labels"] == ["a", "b", "c"]


def test_metrics_of_an_empty_matrix_are_zero():
    m = evaluate.classification_metrics(np.zeros((2, 2)), ["x", "y"])
    assert (m["accuracy"], m["macro_f1"], m["num_examples"]) == (0.0, 0.0, 0)


@pytest.mark.parametrize("static_shapes", [False, True])
def test_confusion_matrix_counts_each_row_once(tiny_model_dir, tmp_path, static_shapes):
    rows = tiny_rows(29, seed=5)
    files = [tmp_path / f"eval-{k}.tfrecord" for k in range(2)]
    for k, path in enumerate(files):
        write_tfrecords(path, rows[k::2])
    files = [str(path) for path in files]
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = checkpoint.load_classifier(tiny_model_dir, LABELS)

    matrix = evaluate.confusion_matrix(strategy, model, files, len(LABELS), 8,
                                       static_shapes=static_shapes, max_seq_length=32)

    # Independent reference: all rows in one batch, padded to the longest.
    width = max(len(ids) for ids, _, _ in rows)
    ids = np.array([r[0] + [0] * (width - len(r[0])) for r in rows], np.int32)
    logits = model({"input_ids": ids, "token_type_ids": np.zeros_like(ids),
                    "attention_mask": (ids > 0).astype(np.int32)})
    expected = np.zeros((2, 2), np.int64)
    np.add.at(expected, ([r[2] for r in rows], np.argmax(logits, axis=1)), 1)
    np.testing.assert_array_equal(matrix, expected)
    assert matrix.sum() == 29 and inputs.PAD_LABEL < 0


def test_the_evaluation_loop_is_one_graph_loop_whatever_the_batch_count(tiny_model_dir,
                                                                         tmp_path):
    """The loop over batches is a graph while loop, traced once: its graph is the same size
    for 3 batches as for 30. A Python loop over the batches would unroll them, one copy of
    the model per batch."""
    rows = tiny_rows(240, seed=1)
    write_tfrecords(tmp_path / "eval.tfrecord", rows)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = checkpoint.load_classifier(tiny_model_dir, LABELS)
    sizes = {}
    for batch in (80, 8):  # 3 batches, 30 batches
        data = evaluate.eval_data(strategy, [str(tmp_path / "eval.tfrecord")], batch, False,
                                   32, None)
        loop = evaluate.count_loop(strategy, model, data,
                                   evaluate.confusion_counts(len(LABELS)))
        graph = loop.get_concrete_function().graph.as_graph_def()
        assert "While" in {node.op for node in graph.node}
        sizes[batch] = len(graph.node) + sum(len(f.node_def) for f in graph.library.function)
        assert loop().numpy().sum() == 240
    assert sizes[80] == sizes[8]


def matrices_under_mirrored(rows: int) -> dict:
    """The confusion matrix of `rows` rows under MirroredStrategy over two logical CPUs,
    global batch 8, both input paths; and one device's."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tmp = Path(tempfile.mkdtemp())
    model_dir = write_tiny_model(tmp / "model")
    write_tfrecords(tmp / "eval.tfrecord", tiny_rows(rows, seed=5))
    out = {}
    for name, devices, static in (("one_device", ["/cpu:0"], False),
                                  ("mirrored", ["/cpu:0", "/cpu:1"], False),
                                  ("mirrored_static", ["/cpu:0", "/cpu:1"], True)):
        strategy = tf.distribute.MirroredStrategy(devices)
        with strategy.scope():
            model = checkpoint.load_classifier(model_dir, LABELS)
        out[name] = evaluate.confusion_matrix(
            strategy, model, [str(tmp / "eval.tfrecord")], len(LABELS), 8,
            static_shapes=static, max_seq_length=32).tolist()
    return out


def test_static_shapes_under_mirrored_count_every_row_once():
    """33 rows in per-replica batches of 4: one replica's share is a batch short. The TPU's
    padded path (static shapes) failed there on tf.distribute's dummy batch; now each
    replica gets filler batches and the counts equal one device's."""
    done = subprocess.run([sys.executable, __file__, "33"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert np.sum(out["one_device"]) == 33
    assert out["mirrored"] == out["one_device"] == out["mirrored_static"]


if __name__ == "__main__":
    print(json.dumps(matrices_under_mirrored(int(sys.argv[1]))))
