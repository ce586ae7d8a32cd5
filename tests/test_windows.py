"""long_text window (issue 48): the window rule against Hugging Face's overflowing tokens with
a stride, the Params' refusals, the tokenize step's window records, evaluation that counts
texts (one replica here; two Mirrored replicas in the train step), the SavedModel that
windows raw strings in its graph (the export step, its fresh-process check), and a trained
example where only windows see the words that decide the label.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_helpers import (CLS, LABELS, SEP, VOCAB, tiny_model_dir,  # noqa: E402,F401
                           write_tiny_model)

from tasks.config import parse_config  # noqa: E402
from tasks.errors import ConfigError  # noqa: E402

# --- the rule -----------------------------------------------------------------------------
LONG = ("the committee met on tuesday to discuss the budget, which had grown by a third "
        "since last year; members argued for hours about cuts to parks, libraries and the "
        "new bus line before the chair called a vote and adjourned")


@pytest.fixture(scope="module")
def minilm():
    from tasks.training import checkpoint

    return checkpoint.resolve_base_model(parse_config({}))


@pytest.mark.parametrize("max_seq_length, stride", [(16, 4), (16, 0), (24, 13)])
def test_windows_are_hugging_faces_overflowing_tokens_with_a_stride(minilm, max_seq_length,
                                                                    stride):
    import tensorflow as tf
    import transformers

    from tasks.model import windows
    from tasks.model.text_encoder import BertTextEncoder
    from tasks.training import checkpoint

    encoder = BertTextEncoder(checkpoint.vocab_path(minilm), True, max_seq_length)
    hf = transformers.BertTokenizerFast.from_pretrained(str(minilm))
    texts = [LONG, "short one", "", LONG[:61], LONG * 2]
    ids, types, text, lengths = windows.encode_windows(encoder, tf.constant(texts), stride)
    want = hf(texts, max_length=max_seq_length, truncation=True, stride=stride,
              return_overflowing_tokens=True)
    assert ids.to_list() == want["input_ids"]
    assert text.numpy().tolist() == want["overflow_to_sample_mapping"]
    assert set(types.flat_values.numpy().tolist()) == {0}
    assert lengths.numpy().tolist() == [len(hf(t)["input_ids"]) for t in texts]
    assert len(want["input_ids"]) > 2 * len(texts)  # the long texts did get several


def test_window_counts_at_the_edges():
    import tensorflow as tf

    from tasks.model import windows

    lengths = [0, 1, 14, 15, 24, 25, 100]
    counts = windows.window_counts(tf.constant(lengths), budget=14, stride=4).numpy()
    assert counts.tolist() == [1, 1, 1, 2, 2, 3, 10]
    pieces = tf.RaggedTensor.from_row_lengths(tf.range(sum(lengths)), lengths)
    got, text = windows.window_pieces(pieces, 14, 4)
    for t, row in enumerate(pieces.to_list()):
        mine = [w for w, i in zip(got.to_list(), text.numpy()) if i == t]
        assert all(len(w) <= 14 for w in mine)
        assert [p for w in mine[:-1] for p in w[:10]] + mine[-1] == row  # overlap 4 each
    with pytest.raises(ValueError, match="below"):
        windows.window_counts(tf.constant([3]), budget=14, stride=14)


# --- the Params ---------------------------------------------------------------------------
def test_window_settings_are_refused_where_they_cannot_act():
    assert parse_config({"long_text": "window", "window_stride": 100,
                         "max_seq_length": 128}).window_stride == 100
    with pytest.raises(ConfigError) as err:
        parse_config({"long_text": "window", "window_stride": 126, "max_seq_length": 128})
    assert "below max_seq_length - 2 = 126" in str(err.value) and "lower it" in str(err.value)
    entities = {"long_text": "window", "task": "token_classification",
                "train_uri": "examples/tasks/entities.conll"}
    assert parse_config(entities).long_text == "window"  # tests/test_token_windows.py
    with pytest.raises(ConfigError, match="most context instead"):
        parse_config({**entities, "window_aggregation": "max"})
    with pytest.raises(ConfigError, match="below max_seq_length - 2 = 30"):
        parse_config({**entities, "window_stride": 30, "max_seq_length": 32})
    with pytest.raises(ConfigError, match="text pairs are not windowed"):
        parse_config({"long_text": "window", "text_pair_column": "hypothesis"})
    for name, value in (("window_stride", 8), ("window_aggregation", "max")):
        with pytest.raises(ConfigError, match="applies to long_text window"):
            parse_config({name: value})  # truncate would ignore it
    for task in ("multi_label", "regression"):
        assert parse_config({"long_text": "window", "task": task}).long_text == "window"


# --- the tokenize step --------------------------------------------------------------------
def _records(shards):
    import tensorflow as tf

    return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(shards)]


def _ints(example, key):
    return list(example.features.feature[key].int64_list.value)


def test_tokenize_writes_every_window_with_its_text_id_and_label(tmp_path, minilm):
    from tasks.io import storage
    from tasks.model.text_encoder import BertTextEncoder
    from tasks.runs.runlayout import RunContext
    from tasks.steps import data, tokenize
    from tasks.training import checkpoint

    manifests = {}
    for mode in ("truncate", "window"):
        extra = {"long_text": "window", "window_stride": 3} if mode == "window" else {}
        cfg = parse_config({"artifact_root": str(tmp_path / mode), "num_shards": 3,
                            "max_seq_length": 12, **extra})
        ctx = RunContext(str(tmp_path / mode), "dag", "run1")
        data.run(cfg, ctx)
        manifests[mode] = storage.read_json(tokenize.run(cfg, ctx))
    cut, windowed = manifests["truncate"], manifests["window"]
    assert cut["content_hash"] != windowed["content_hash"]
    assert windowed["long_text"] == "window" and windowed["window_stride"] == 3
    assert windowed["label_spec"]["text_id"] is True and "text_id" not in cut["label_spec"]
    prepared = storage.read_json(ctx.manifest_uri("data"))["splits"]["train"]["shards"]
    rows = [json.loads(line) for uri in prepared for line in storage.read_text(uri).splitlines()]
    encoder = BertTextEncoder(checkpoint.vocab_path(minilm), True, 12)
    pieces = encoder.wordpieces(np.array([r["text"] for r in rows])).to_list()
    for name in ("train", "eval"):
        split, before = windowed["splits"][name], cut["splits"][name]
        assert split["num_examples"] == before["num_examples"]
        assert split["num_windowed"] == before["num_truncated"] > 0
        assert split["num_truncated"] == 0
        records = _records(split["shards"])
        assert len(records) == split["num_records"] > split["num_examples"]
        ids = [_ints(r, "text_id")[0] for r in records]
        assert ids == sorted(ids) and set(ids) == set(range(split["num_examples"]))
    # Each training text's windows, overlap removed, are all of its pieces, with its label.
    records = _records(windowed["splits"]["train"]["shards"])
    for t, row in enumerate(rows):
        mine = [r for r in records if _ints(r, "text_id")[0] == t]
        assert {_ints(r, "label")[0] for r in mine} == {row["label"]}
        bodies = [_ints(r, "input_ids")[1:-1] for r in mine]
        assert all(_ints(r, "input_ids")[0] == encoder.cls_id for r in mine)
        assert [p for b in bodies[:-1] for p in b[:7]] + bodies[-1] == pieces[t]

    # The run page's line, from this manifest.
    from tasks.runs.run_summary import long_texts

    line = long_texts(windowed)
    train = windowed["splits"]["train"]
    assert f"train: {train['num_windowed']} of {train['num_examples']} texts windowed, " \
        f"{train['num_records']} windows" in line and long_texts(cut) is None
    # ... and the model card's.
    from tasks.steps.export import long_texts_line

    assert f"({train['num_windowed']} of {train['num_examples']} training texts windowed, " \
        f"{train['num_records']} windows)" in long_texts_line(cfg, windowed)
    assert long_texts_line(cfg, cut).startswith(
        f"truncated ({cut['splits']['train']['num_truncated']} training texts cut")



# --- evaluation -----------------------------------------------------------------------------
def window_rows(n: int, seed: int, task: str = "classification") -> list[tuple]:
    """Texts of 3-60 tiny words cut into windows of at most 14 words overlapping by 4, as
    (text id, window ids, label) with the text's label on each window."""
    rng = random.Random(seed)
    rows = []
    for t in range(n):
        label = t % 2
        words = [rng.randrange(5 + 47 * label, 52 + 48 * label)
                 for _ in range(rng.randint(3, 60))]
        if task == "regression":
            label = [round(rng.random(), 3)]
        elif task == "multi_label":
            label = [float(label), float(rng.random() < 0.5)]
        starts = range(0, max(1, len(words) - 4), 10)
        for k, start in enumerate(starts):
            if k and start + 4 >= len(words):
                break
            rows.append((t, [CLS] + words[start:start + 14] + [SEP], label))
    return rows


def write_windows(folder: Path, rows: list[tuple], shards: int = 3) -> list[str]:
    """Windows spread over shards in turn, so a text's windows sit in different files,
    batches and (with 2 replicas) replicas."""
    from tasks.io import tfrecord_io

    files = []
    for k in range(shards):
        part = rows[k::shards]
        ids = np.array([i for _, w, _ in part for i in w], np.int64)
        lengths = np.array([len(w) for _, w, _ in part])
        labels = np.array([label for _, _, label in part],
                          np.float32 if isinstance(part[0][2], list) else np.int64)
        records, _ = tfrecord_io.example_records(ids, lengths, np.zeros_like(ids), labels,
                                                 framed=True,
                                                 text_ids=np.array([t for t, _, _ in part]))
        path = folder / f"eval-{k}.tfrecord"
        path.write_bytes(records.tobytes())
        files.append(str(path))
    return files


SPECS = {"classification": ({"dtype": "int64", "shape": []}, LABELS),
         "multi_label": ({"dtype": "float32", "shape": [2]}, ["lower", "upper"]),
         "regression": ({"dtype": "float32", "shape": [1]}, ["score"])}


def windowed_metrics(strategy, model, files, task, how, static_shapes=False):
    from tasks.steps import evaluate
    from tasks.task_kinds import kind

    spec, labels = SPECS[task]
    return evaluate.metrics_function(
        kind(task), strategy, model, files, labels, 8 * strategy.num_replicas_in_sync, 0.5,
        static_shapes=static_shapes, max_seq_length=16, label_spec={**spec, "text_id": True},
        aggregation=how)()


def forward(model, windows: list[list[int]]) -> np.ndarray:
    """Logits of each window, all in one batch padded to the longest (masked)."""
    width = max(map(len, windows))
    ids = np.array([w + [0] * (width - len(w)) for w in windows], np.int32)
    return model({"input_ids": ids, "token_type_ids": np.zeros_like(ids),
                  "attention_mask": (ids > 0).astype(np.int32)}, training=False).numpy()


def reference_metrics(model, rows, task, how):
    """Each window through the model alone, its text's logits the mean or max by hand."""
    from tasks.steps import evaluate
    from tasks.task_kinds import kind

    labels, logits = texts_by_hand(model, rows, how)
    return evaluate.text_scores(kind(task), SPECS[task][1], 0.5)(labels, logits)


def texts_by_hand(model, rows, how):
    """(labels, logits) per text in id order: each window alone through the model, a text's
    logits the mean or max of its windows'."""
    by_text: dict[int, list] = {}
    truth = {}
    for (t, _, label), logits in zip(rows, forward(model, [ids for _, ids, _ in rows])):
        by_text.setdefault(t, []).append(logits)
        truth[t] = label
    texts = sorted(by_text)
    logits = np.array([getattr(np, how)(by_text[t], axis=0) for t in texts], np.float32)
    return np.array([np.reshape(truth[t], -1) for t in texts], np.float32), logits


def _close(got: dict, want: dict) -> None:
    for key, value in want.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, abs=1e-5), key
        elif not isinstance(value, dict):
            assert got[key] == value, key


@pytest.mark.parametrize("task, how, static_shapes", [
    ("classification", "mean", False), ("classification", "max", True),
    ("multi_label", "max", False), ("regression", "mean", False)])
def test_evaluation_counts_texts_from_their_aggregated_windows(tiny_model_dir, tmp_path, task,
                                                               how, static_shapes):
    import tensorflow as tf

    from tasks.task_kinds import kind
    from tasks.training import checkpoint

    rows = window_rows(23, seed=4, task=task)
    files = write_windows(tmp_path, rows)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    labels = SPECS[task][1]
    with strategy.scope():
        model = checkpoint.load_classifier(tiny_model_dir, labels, head=kind(task).head)
    got = windowed_metrics(strategy, model, files, task, how, static_shapes)
    assert got["num_examples"] == 23 < len(rows)
    _close(got, reference_metrics(model, rows, task, how))


def test_tuned_thresholds_count_texts_from_their_aggregated_windows(tiny_model_dir, tmp_path):
    """multi_label_threshold tuned on windowed validation rows: each text counts once, from
    its windows' aggregated logits, as the test metrics and the SavedModel count it."""
    from types import SimpleNamespace

    import tensorflow as tf

    from tasks import thresholds
    from tasks.steps import evaluate
    from tasks.task_kinds import kind
    from tasks.training import checkpoint

    rows = window_rows(23, seed=5, task="multi_label")
    files = write_windows(tmp_path, rows)
    spec, labels = SPECS["multi_label"]
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = checkpoint.load_classifier(tiny_model_dir, labels, head=kind("multi_label").head)
    cfg = SimpleNamespace(eval_batch_size=8, max_seq_length=16, window_aggregation="max",
                          decision_threshold_metric="f1")
    tok = {"task": "multi_label", "labels": labels, "label_spec": {**spec, "text_id": True}}
    got = evaluate.tuned_thresholds(cfg, tok, strategy, "one_device", model, files)
    assert got["validation_rows"] == 23 < len(rows)
    truth, logits = texts_by_hand(model, rows, "max")
    counts = evaluate.threshold_counts(kind("multi_label"), len(labels))[0](
        tf.constant(truth), tf.constant(logits)).numpy()
    assert got["per_label"] == thresholds.choose(counts, labels)["per_label"]


def test_windows_of_a_text_are_put_together_by_id_in_any_order():
    from tasks.model import windows

    ids = np.array([7, 3, 7, 9, 3, 7])
    truth = np.array([[1], [0], [1], [1], [0], [1]], np.float32)
    logits = np.array([[1, 0], [0, 2], [3, -1], [5, 5], [4, 0], [-1, 4]], np.float32)
    labels, mean = windows.by_text(ids, truth, logits, "mean")
    assert labels[:, 0].tolist() == [0, 1, 1]  # ids 3, 7, 9
    np.testing.assert_allclose(mean, [[2, 1], [1, 1], [5, 5]])
    np.testing.assert_allclose(windows.by_text(ids, truth, logits, "max")[1],
                               [[4, 2], [3, 4], [5, 5]])


def write_windowed_run(ctx, splits: dict[str, int], seed: int = 6) -> dict[str, list]:
    """tokenize/manifest.json of windowed tiny data, as the tokenize step writes it with
    long_text window; the rows of each split."""
    from tasks.runs.runlayout import write_manifest

    cache = Path(ctx.artifact_root) / "cache" / "tfrecords" / "windows"
    rows, entries = {}, {}
    for k, (split, texts) in enumerate(splits.items()):
        rows[split] = window_rows(texts, seed=seed + k)
        folder = cache / split
        folder.mkdir(parents=True)
        entries[split] = {"shards": write_windows(folder, rows[split]), "num_examples": texts,
                          "num_records": len(rows[split]), "num_truncated": 0,
                          "num_windowed": len({t for t, w, _ in rows[split] if len(w) == 16}),
                          "length_histogram": {"edges": [], "counts": []}}
    write_manifest(ctx.step_uri("tokenize"), {
        "content_hash": "windows", "cache_uri": str(cache), "reused": False,
        "vocab_size": len(VOCAB), "max_seq_length": 16, "lower_case": True, "has_pair": False,
        "task": "classification", "labels": LABELS, "long_text": "window", "window_stride": 4,
        "label_spec": {"dtype": "int64", "shape": [], "text_id": True}, "splits": entries})
    return rows


def test_the_train_step_validates_and_evaluates_texts_under_two_mirrored_replicas(
        tiny_model_dir, tmp_path):
    """The train step (a fresh process: 2 logical CPUs, MirroredStrategy) on windows: an
    epoch is every window, validation and the test evaluation count texts (the evaluate
    count check passes), and the test metrics equal the saved model's windows aggregated by
    hand: a text's windows sit in different shards, batches and replicas."""
    import tensorflow as tf

    from tasks.io import storage
    from tasks.runs.runlayout import read_manifest
    from tasks.training import checkpoint
    from train_helpers import make_run, run_steps_in_subprocess

    cfg, ctx = make_run(tmp_path, tiny_model_dir, long_text="window", window_stride=4,
                        max_seq_length=16, devices_per_worker=2, epochs=1,
                        eval_every_steps=2, window_aggregation="max")
    rows = write_windowed_run(ctx, {"train": 40, "eval": 31, "validation": 17})
    done = run_steps_in_subprocess(ctx.run_uri, "train", "evaluate", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    trained = read_manifest(ctx.manifest_uri("train"))
    assert trained["strategy"] == "mirrored" and trained["num_replicas"] == 2
    assert trained["num_train_records"] == len(rows["train"]) > 40
    assert trained["steps"] == -(-len(rows["train"]) // trained["global_batch_size"])
    metrics = storage.read_json(read_manifest(ctx.manifest_uri("evaluate"))["metrics_uri"])
    assert metrics["num_examples"] == 31 < len(rows["eval"])
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = checkpoint.load_classifier(Path(trained["model_dir"]), LABELS)
    _close(metrics, reference_metrics(model, rows["eval"], "classification", "max"))
    # The saved weights are the best validation step's: its record is their score on the
    # 17 validation texts.
    history = json.loads(Path(ctx.step_uri("train"), "history.json").read_text())
    (best,) = [r for r in history["validation"]
               if r["step"] == trained["validation"]["best_step"]]
    want = reference_metrics(model, rows["validation"], "classification", "max")
    assert want["num_examples"] == 17 < len(rows["validation"])
    assert best["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6)


# --- serving --------------------------------------------------------------------------------
def _words(ids):
    return " ".join(VOCAB[i] for i in ids)


def test_the_serving_function_windows_raw_text_and_aggregates_its_windows(tiny_model_dir):
    import tensorflow as tf

    from tasks.model import windows
    from tasks.model.text_encoder import BertTextEncoder
    from tasks.steps import export
    from tasks.task_kinds import kind
    from tasks.training import checkpoint

    model = checkpoint.load_classifier(tiny_model_dir, LABELS)
    encoder = BertTextEncoder(tiny_model_dir / "vocab.txt", True, 16)
    rng = random.Random(3)
    texts = [_words(rng.randrange(5, 100) for _ in range(n)) for n in (40, 3, 14, 15, 90)]
    module = export.serving_module(encoder, model, LABELS, False, kind("classification"),
                                   window=(4, "max"))
    served = module.serve(tf.constant(texts))  # saved and loaded: the export step's test
    ids, _, text, _ = windows.encode_windows(encoder, tf.constant(texts), 4)
    assert len(ids.to_list()) > len(texts) + 5
    logits = forward(model, ids.to_list())
    for t in range(len(texts)):
        want = tf.nn.softmax(np.max(logits[text.numpy() == t], axis=0)).numpy()
        np.testing.assert_allclose(served["probabilities"].numpy()[t], want, atol=1e-5)
    # The end of a long text reaches the model: changing only its last words moves the
    # windowed prediction and leaves the truncating one as it was.
    end_changed = [texts[4].rsplit(" ", 5)[0] + " " + _words([99] * 5)]
    truncating = export.serving_module(encoder, model, LABELS, False, kind("classification"))
    for serve, moves in ((module.serve, True), (truncating.serve, False)):
        a = serve(tf.constant(texts[4:5]))["probabilities"].numpy()
        b = serve(tf.constant(end_changed))["probabilities"].numpy()
        assert np.array_equal(a, b) is not moves  # the same pieces give the same bits


def test_the_export_step_publishes_a_windowing_saved_model(tmp_path):
    """build_version on a windowed run's manifests: the SavedModel passes the fresh-process
    check and serves a long text as its windows' mean, and the card says how."""
    import tensorflow as tf

    from tasks.io import storage
    from tasks.model import windows
    from tasks.model.text_encoder import BertTextEncoder
    from tasks.runs import runlayout
    from tasks.steps import export
    from tasks.training import checkpoint
    from test_export import VOCAB as WORDS, fake_run, write_model

    model_dir = write_model(tmp_path / "model")
    ctx = fake_run(tmp_path, model_dir)
    tokens = runlayout.read_manifest(ctx.manifest_uri("tokenize"))
    runlayout.write_manifest(ctx.step_uri("tokenize"), {
        **tokens, "max_seq_length": 12, "long_text": "window", "window_stride": 3,
        "splits": {"train": {"num_examples": 10, "num_windowed": 4, "num_records": 19,
                             "num_truncated": 0}}})
    cfg = parse_config({"artifact_root": ctx.artifact_root, "long_text": "window",
                        "window_stride": 3, "window_aggregation": "mean",
                        "max_seq_length": 12})
    export.build_version(cfg, ctx, tmp_path / "out", "v1")
    text = " ".join(WORDS[5 + i % 18] for i in range(40))
    served = tf.saved_model.load(str(tmp_path / "out" / "saved_model")).signatures[
        "serving_default"](text=tf.constant([text, "a good movie"]))
    model = checkpoint.load_classifier(model_dir, ["negative", "positive"])
    encoder = BertTextEncoder(model_dir / "vocab.txt", True, 12)
    ids, _, index, _ = windows.encode_windows(encoder, tf.constant([text]), 3)
    assert len(ids.to_list()) > 3
    want = tf.nn.softmax(forward(model, ids.to_list()).mean(axis=0)).numpy()
    np.testing.assert_allclose(served["probabilities"].numpy()[0], want, atol=1e-5)
    assert served["probabilities"].shape == (2, 2)
    card = storage.read_text(str(tmp_path / "out" / "model_card.md"))
    assert "long texts: windows overlapping by 3 pieces, the mean of their logits per text " \
           "(4 of 10 training texts windowed, 19 windows)" in card



def _end_labelled(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Texts of the same 30 filler words, then 4 words that give the label away: the label
    lives only past the first window (pieces 0-13 of 34)."""
    rng = random.Random(seed)
    labels = np.arange(n) % 2
    texts = [_words(FILLER + [rng.randrange(60, 70) + 20 * int(label) for _ in range(4)])
             for label in labels]
    return texts, labels


def _trained(encoder, model, texts, labels, stride: int | None) -> None:
    """A few epochs of Adam on the records the tokenize step would write: each window with
    its text's label (stride given), else each text cut to max_seq_length."""
    import tensorflow as tf
    import tf_keras

    from tasks.model import windows

    if stride is None:
        ids, _ = encoder(tf.constant(texts))
        text = np.arange(len(texts))
    else:
        ids, _, text, _ = windows.encode_windows(encoder, tf.constant(texts), stride)
        text = text.numpy()
    x = ids.to_tensor().numpy().astype(np.int32)
    features = {"input_ids": x, "token_type_ids": np.zeros_like(x),
                "attention_mask": (x > 0).astype(np.int32)}
    y = labels[text]
    optimizer = tf_keras.optimizers.Adam(LEARNING_RATE)

    @tf.function
    def step():  # the whole set in one batch: a few hundred windows of 16 pieces
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                y, model(features, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(STEPS):
        step()


LEARNING_RATE, STEPS = 3e-3, 60
FILLER = [5 + (7 * i) % 40 for i in range(30)]


def test_a_label_at_the_end_is_learned_with_windows_and_lost_by_truncation(tmp_path):
    """A constructed, trained example: the words that decide the label sit at the end of
    34-piece texts, the model sees 16. Each side is trained from the same random weights
    and served by its SavedModel module on new texts."""
    import tensorflow as tf

    from tasks.model.text_encoder import BertTextEncoder
    from tasks.steps import export
    from tasks.task_kinds import kind
    from tasks.training import checkpoint

    model_dir = write_tiny_model(tmp_path / "model", seed=1)
    encoder = BertTextEncoder(model_dir / "vocab.txt", True, 16)
    texts, labels = _end_labelled(96, seed=1)
    held_out, truth = _end_labelled(40, seed=2)
    accuracy = {}
    for mode, stride in (("window", 4), ("truncate", None)):
        tf.keras.utils.set_random_seed(0)
        model = checkpoint.load_classifier(model_dir, LABELS)
        _trained(encoder, model, texts, labels, stride)
        module = export.serving_module(encoder, model, LABELS, False, kind("classification"),
                                       window=None if stride is None else (stride, "mean"))
        predicted = module.serve(tf.constant(held_out))["label"].numpy().astype(str)
        accuracy[mode] = float(np.mean(predicted == np.array(LABELS)[truth]))
    # Truncated, every text is the same 14 filler pieces: one prediction for all, half right.
    assert accuracy["window"] >= 0.9 and accuracy["truncate"] == 0.5, accuracy

