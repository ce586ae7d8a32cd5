"""long_text window for token classification (issue 48): the windows against Hugging Face's
overflowing tokens with a stride (words given as a list), each word's window by BERT's
SQuAD max-context rule, the tokenize step's records, entity metrics that count sentences
(one replica; the train and evaluate steps under two Mirrored replicas in a fresh
process), the export step's SavedModel of that run serving entities at character offsets
past max_seq_length in a fresh interpreter, and a trained example whose
entities sit only past max_seq_length: windows find them, in the saved serving signature
loaded by a fresh interpreter too; truncation cannot.
"""
from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_helpers import VOCAB, write_tiny_model  # noqa: E402

from tasks.task_kinds import IGNORED  # noqa: E402

PIECES = VOCAB + ["##a", "##b"]  # "w7a" is two pieces: w7 ##a
TAGS = ["O", "B-X", "I-X"]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(PIECES) + "\n")
    return path


def sentences(n: int, seed: int, longest: int = 40) -> tuple[list[list[str]], list[list[int]]]:
    """Random words of one or two pieces, tags O / B-X / I-X (an I-X only after a tag X)."""
    rng = random.Random(seed)
    words, tags = [], []
    for _ in range(n):
        count = rng.randint(1, longest)
        words.append([f"w{rng.randrange(5, 90)}{rng.choice(['', '', 'a', 'b'])}"
                      for _ in range(count)])
        row = [rng.choice([0, 0, 1])]
        for _ in range(count - 1):
            row.append(rng.choice([0, 1, 2] if row[-1] else [0, 0, 1]))
        tags.append(row)
    return words, tags


def aligner(vocab: Path, max_seq_length: int, stride: int | None):
    from tasks.model.text_encoder import BertTextEncoder
    from tasks.model.token_encoding import WordPieceAligner

    return WordPieceAligner(BertTextEncoder(vocab, True, max_seq_length), stride)


def ragged(rows, dtype):
    import tensorflow as tf

    return tf.ragged.constant(rows, dtype=dtype, row_splits_dtype=tf.int64,
                              inner_shape=None if any(rows) else (0,))


# --- the windows ----------------------------------------------------------------------------
@pytest.mark.parametrize("max_seq_length, stride", [(12, 3), (16, 9)])
def test_windows_are_hugging_faces_overflowing_tokens_of_the_words(vocab, max_seq_length,
                                                                   stride):
    """Token for token HF's windows; the training labels are the tag on every word's first
    piece in every window (a window that starts inside a word leaves that piece unlabelled,
    where run_ner would label it: the word is labelled in the window with its first piece)."""
    import tensorflow as tf
    import transformers

    words, tags = sentences(9, seed=max_seq_length + stride)
    hf = transformers.BertTokenizer(vocab=str(vocab), do_lower_case=True)
    want = hf(words, is_split_into_words=True, max_length=max_seq_length, truncation=True,
              stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)
    enc = aligner(vocab, max_seq_length, stride)  # held: its tf.functions refer to it weakly
    out = enc.align(ragged(words, tf.string), ragged(tags, tf.int64))
    assert out["input_ids"].to_list() == want["input_ids"]
    assert out["text"].numpy().tolist() == want["overflow_to_sample_mapping"]
    assert len(want["input_ids"]) > 2 * len(words)  # several windows per sentence
    expected = []
    for i, sentence in enumerate(want["overflow_to_sample_mapping"]):
        expected.append([tags[sentence][w] if w is not None and start == 0 else IGNORED
                         for w, (start, _) in zip(want.word_ids(i), want["offset_mapping"][i])])
    assert out["labels"].to_list() == expected
    assert set(out["token_type_ids"].flat_values.numpy().tolist()) == {0}


def squad_max_context(spans: list[tuple[int, int]], position: int) -> int:
    """BERT's run_squad.py _check_is_max_context: the span (start, length) where `position`
    has the most context, the first on a tie."""
    best, best_score = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if start <= position <= end:
            score = min(position - start, end - position) + 0.01 * length
            if best_score is None or score > best_score:
                best, best_score = index, score
    return best


@pytest.mark.parametrize("max_seq_length, stride", [(10, 5), (16, 0)])
def test_each_word_is_predicted_from_its_max_context_window(vocab, max_seq_length, stride):
    import tensorflow as tf

    words, tags = sentences(12, seed=stride, longest=60)
    words[3], tags[3] = [], []  # no words: one empty window
    budget = max_seq_length - 2
    enc = aligner(vocab, max_seq_length, stride)
    served = enc.encode_words(ragged(words, tf.string))
    held_out = enc.align_max_context(ragged(words, tf.string), ragged(tags, tf.int64))
    text = served["text"].numpy()
    lengths = [len(w) - 2 for w in served["input_ids"].to_list()]
    labels = held_out["labels"].to_list()
    pieces = enc.encoder.wordpieces(tf.constant([w for row in words for w in row])).to_list()
    k = 0
    for s, row in enumerate(words):
        mine = np.flatnonzero(text == s)  # the sentence's windows, in order
        spans = [(j * (budget - stride), lengths[w]) for j, w in enumerate(mine)]
        position, want_windows, want_starts = 0, [], []
        for _ in row:
            best = squad_max_context(spans, position)
            want_windows.append(int(mine[best]))
            want_starts.append(position - spans[best][0] + 1)
            position += len(pieces[k])
            k += 1
        assert served["word_windows"][s].numpy().tolist() == want_windows
        assert served["word_starts"][s].numpy().tolist() == want_starts
        # Evaluation labels each word once, there.
        found = [(w, j, label) for w in mine for j, label in enumerate(labels[w])
                 if label != IGNORED]
        assert found == list(zip(want_windows, want_starts, tags[s]))
    assert any(len(set(w)) > 2 for w in served["word_windows"].to_list())


# --- the tokenize step ----------------------------------------------------------------------
def test_tokenize_writes_token_windows_and_counts_sentences(tmp_path):
    """A CoNLL file of long sentences through the data and tokenize steps (the default
    checkpoint's vocabulary): train windows label every word start, held-out windows each
    word once, and every record names its sentence and its place."""
    import tensorflow as tf

    from tasks.config import parse_config
    from tasks.io import storage
    from tasks.runs.runlayout import RunContext
    from tasks.steps import data, tokenize
    from tasks.training import inputs

    words, tags = sentences(30, seed=3, longest=30)
    conll = tmp_path / "train.conll"
    conll.write_text("".join("".join(f"{w}\t{TAGS[t]}\n" for w, t in zip(ws, ts)) + "\n"
                             for ws, ts in zip(words, tags)))
    cfg = parse_config({"task": "token_classification", "train_uri": str(conll),
                        "artifact_root": str(tmp_path / "a"), "num_shards": 2,
                        "max_seq_length": 16, "long_text": "window", "window_stride": 4,
                        "eval_fraction": 0.3})
    ctx = RunContext(cfg.artifact_root, "dag", "run1")
    data.run(cfg, ctx)
    manifest = storage.read_json(tokenize.run(cfg, ctx))
    assert manifest["label_spec"] == {"dtype": "int64", "shape": [None], "per_token": True,
                                      "text_id": True, "window_index": True}
    for name, once in (("train", False), ("eval", True)):
        split = manifest["splits"][name]
        assert split["num_records"] > split["num_examples"] and split["num_windowed"] > 0
        rows = list(tf.data.TFRecordDataset(split["shards"]).map(
            lambda r: inputs.parse_example(r, manifest["label_spec"], text_ids=True)))
        assert len(rows) == split["num_records"]
        ids = [tuple(f["text_id"].numpy().tolist()) for f, _ in rows]
        texts = sorted({t for t, _ in ids})
        assert texts == list(range(split["num_examples"]))
        assert ids == sorted(ids) and all(ids.count((t, 0)) == 1 for t in texts)
        labelled = sum(int(np.sum(label.numpy() != IGNORED)) for _, label in rows)
        # The split's words: once each held out; in every window that has them in training.
        prepared = storage.read_json(ctx.manifest_uri("data"))["splits"][name]["shards"]
        count = sum(len(json.loads(line)["words"]) for uri in prepared
                    for line in storage.read_text(uri).splitlines())
        assert (labelled == count) if once else (labelled > count)
    from tasks.steps.export import long_texts_line

    assert "4 pieces, each word from the window where it has the most context (" \
        in long_texts_line(cfg, manifest)


# --- evaluation -----------------------------------------------------------------------------
def token_model(model_dir: Path):
    from tasks.task_kinds import kind
    from tasks.training import checkpoint

    return checkpoint.load_classifier(model_dir, TAGS, head=kind("token_classification").head)


def write_eval_windows(folder: Path, vocab: Path, words, tags, stride=3, shards=3):
    """The tokenize step's held-out records (its token codec), windows dealt over shards in
    turn so that a sentence's windows sit in different files, batches and replicas."""
    from tasks.io import tfrecord_io
    from tasks.model.text_encoder import BertTextEncoder
    from tasks.steps.prepared import TokenRow
    from tasks.steps.tokenize import _TokenCodec

    codec = _TokenCodec(BertTextEncoder(vocab, True, 12), stride)
    ids, lengths, types, _, (labels, label_lengths), text, place = codec.encode(
        [TokenRow(w, t) for w, t in zip(words, tags)], "eval")
    at = np.concatenate([[0], np.cumsum(lengths)])
    files = []
    for k in range(shards):
        rows = np.arange(k, len(lengths), shards)
        flat = np.concatenate([ids[at[r]:at[r + 1]] for r in rows])
        flat_labels = np.concatenate([labels[at[r]:at[r + 1]] for r in rows])
        records, _ = tfrecord_io.example_records(
            flat, lengths[rows], np.zeros_like(flat), (flat_labels, label_lengths[rows]),
            framed=True, text_ids=np.stack([text[rows], place[rows]], 1))
        path = folder / f"eval-{k}.tfrecord"
        path.write_bytes(records.tobytes())
        files.append(str(path))
    return files, len(lengths)


def entity_metrics_of(strategy, model, files, static_shapes=False) -> dict:
    from tasks.steps import evaluate
    from tasks.task_kinds import kind

    spec = {"dtype": "int64", "shape": [None], "per_token": True, "text_id": True,
            "window_index": True}
    return evaluate.metrics_function(
        kind("token_classification"), strategy, model, files, TAGS,
        4 * strategy.num_replicas_in_sync, static_shapes=static_shapes, max_seq_length=12,
        label_spec=spec)()


def metrics_by_hand(vocab: Path, model, words, tags, stride=3) -> dict:
    """Each sentence's words tagged by the served path (every window through the model,
    each word read in its own window), scored as whole sentences by conlleval's rule."""
    import tensorflow as tf

    from tasks.training import entity_metrics

    enc = aligner(vocab, 12, stride)
    out = enc.encode_words(ragged(words, tf.string))
    ids = out["input_ids"].to_tensor()
    logits = model({"input_ids": ids, "token_type_ids": tf.zeros_like(ids),
                    "attention_mask": tf.ones_like(out["input_ids"]).to_tensor()},
                   training=False).numpy()
    predicted = [[TAGS[int(np.argmax(logits[w, j]))] for w, j in zip(ws, js)]
                 for ws, js in zip(out["word_windows"].to_list(), out["word_starts"].to_list())]
    truth = [[TAGS[t] for t in row] for row in tags]
    types = entity_metrics.entity_types(TAGS)
    scores = entity_metrics.entity_scores(
        entity_metrics.count_entities(truth, predicted, types), types)
    return {**scores, "num_examples": len(words)}


def _same(got: dict, want: dict) -> None:
    assert got["num_examples"] == want["num_examples"]
    for key in ("precision", "recall", "f1", "macro_f1"):
        assert got[key] == pytest.approx(want[key], abs=1e-9), key
    assert got["per_type"] == want["per_type"]


def test_entity_metrics_count_sentences_from_their_windows(vocab, tmp_path):
    import tensorflow as tf

    words, tags = sentences(17, seed=8)
    files, windows = write_eval_windows(tmp_path, vocab, words, tags)
    model_dir = write_tiny_model(tmp_path / "model", seed=2, vocab_size=len(PIECES))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = token_model(model_dir)
    want = metrics_by_hand(vocab, model, words, tags)
    assert windows > 2 * len(words) and want["per_type"]["X"]["predicted"] > 0
    for static_shapes in (False, True):
        _same(entity_metrics_of(strategy, model, files, static_shapes), want)


@pytest.fixture(scope="module")
def mirrored_run(tmp_path_factory) -> dict:
    """The data and tokenize steps on a CoNLL file of long sentences (entities only past
    max_seq_length), then the train, evaluate and export steps in a fresh process (2 logical
    CPUs, MirroredStrategy)."""
    from tasks.config import RunConfig
    from tasks.io import storage
    from tasks.runs.runlayout import RunContext
    from tasks.steps import data, tokenize
    from train_helpers import run_steps_in_subprocess, write_run_config

    tmp_path = tmp_path_factory.mktemp("mirrored")
    model_dir = write_tiny_model(tmp_path / "model", seed=1)
    words, tags = end_entities(80, seed=1)
    conll = tmp_path / "train.conll"
    conll.write_text("".join("".join(f"{w}\t{TAGS[t]}\n" for w, t in zip(ws, ts)) + "\n"
                             for ws, ts in zip(words, tags)))
    cfg = RunConfig(base_model=str(model_dir), artifact_root=str(tmp_path / "a"),
                    task="token_classification", train_uri=str(conll), max_seq_length=12,
                    long_text="window", window_stride=3, devices_per_worker=2, epochs=12,
                    per_replica_batch_size=8, eval_batch_size=4, learning_rate=5e-3,
                    mixed_precision="none", eval_fraction=0.2, validation_fraction=0.2,
                    num_shards=2)
    ctx = RunContext(artifact_root=cfg.artifact_root, dag_id="test", run_key="run1")
    write_run_config(ctx, cfg)
    storage.write_json(f"{ctx.run_uri}/context.json", ctx.to_dict())
    data.run(cfg, ctx)
    tok = storage.read_json(tokenize.run(cfg, ctx))
    done = run_steps_in_subprocess(ctx.run_uri, "train", "evaluate", "export", timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [json.loads(line) for uri in storage.read_json(ctx.manifest_uri("data"))[
        "splits"]["eval"]["shards"] for line in storage.read_text(uri).splitlines()]
    return {"ctx": ctx, "tok": tok, "model_dir": model_dir, "test_rows": rows}


def test_the_train_and_evaluate_steps_count_sentences_under_two_mirrored_replicas(
        mirrored_run):
    """An epoch is every window, the metrics count the test sentences once each, and equal
    the saved model's words read by hand, each from its own window."""
    import tensorflow as tf

    from tasks.io import storage
    from tasks.runs.runlayout import read_manifest

    ctx, tok, rows = mirrored_run["ctx"], mirrored_run["tok"], mirrored_run["test_rows"]
    trained = read_manifest(ctx.manifest_uri("train"))
    assert trained["strategy"] == "mirrored" and trained["num_replicas"] == 2
    assert trained["num_train_records"] == tok["splits"]["train"]["num_records"]
    metrics = storage.read_json(read_manifest(ctx.manifest_uri("evaluate"))["metrics_uri"])
    test = tok["splits"]["eval"]
    assert metrics["num_examples"] == test["num_examples"] < test["num_records"]
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = token_model(Path(trained["model_dir"]))
    want = metrics_by_hand(mirrored_run["model_dir"] / "vocab.txt", model,
                           [r["words"] for r in rows], [r["tags"] for r in rows])
    _same(metrics, want)
    assert metrics["f1"] >= 0.9 and want["per_type"]["X"]["support"] > test["num_examples"]


def test_the_export_step_serves_entities_past_max_seq_length_at_character_offsets(
        mirrored_run):
    """The export step's SavedModel of the windowed run, loaded by a fresh interpreter:
    raw test texts (longer than max_seq_length, entities only past it) in, one row of
    entities per text out, at character offsets into the raw strings, as the evaluation
    found them."""
    from tasks.io import storage
    from tasks.runs.runlayout import read_manifest

    ctx, rows = mirrored_run["ctx"], mirrored_run["test_rows"]
    exported = read_manifest(ctx.manifest_uri("export"))
    assert exported["task"] == "token_classification" and exported["published"] is True
    card = storage.read_text(f"{exported['version_uri']}/model_card.md")
    assert "each word from the window where it has the most context" in card
    texts = [raw_text(r["words"]) for r in rows]
    want = [spans_of(t, r["words"], r["tags"]) for t, r in zip(texts, rows)]
    (found,) = served_in_fresh_process(
        {"export": f"{exported['version_uri']}/saved_model"}, texts).values()
    assert len(found) == len(texts)
    for text, entities in zip(texts, found):
        assert all(text[start:end] == word for _, start, end, word in entities)
    # Every true entity starts past the first window's 10 pieces (one word each): it is
    # found only through the windows.
    true = {(i, *e) for i, spans in enumerate(want) for e in spans}
    assert all(start > len(raw_text(rows[i]["words"][:10])) for i, _, start, _, _ in true)
    served = {(i, *e) for i, spans in enumerate(found) for e in spans}
    metrics = storage.read_json(read_manifest(ctx.manifest_uri("evaluate"))["metrics_uri"])
    assert len(true & served) / len(true) == pytest.approx(metrics["recall"], abs=0.05)
    assert len(true & served) / len(served) == pytest.approx(metrics["precision"], abs=0.05)


# --- training and serving ---------------------------------------------------------------------
FILLER = [f"w{i}" for i in range(5, 45)]
FIRST, LAST = [f"w{i}" for i in range(60, 70)], [f"w{i}" for i in range(70, 80)]


def end_entities(n: int, seed: int) -> tuple[list[list[str]], list[list[int]]]:
    """Sentences of 14-22 filler words (O) with one or two entities, a first name (B-X) and
    maybe a last name (I-X), among their last words: all past the first 10 pieces, which
    max_seq_length 12 keeps. A word's tag follows from the word."""
    rng = random.Random(seed)
    words, tags = [], []
    for _ in range(n):
        row = [rng.choice(FILLER) for _ in range(rng.randint(14, 22))]
        labels = [0] * len(row)
        for at in range(11 + rng.randrange(3), len(row) - 1, 4 + rng.randrange(3)):
            row[at], labels[at] = rng.choice(FIRST), 1
            if rng.random() < 0.5:
                row[at + 1], labels[at + 1] = rng.choice(LAST), 2
        words.append(row)
        tags.append(labels)
    return words, tags


def train(model, out: dict, steps: int = 60) -> None:
    """Adam on the whole set as one batch: the training records the tokenize step writes
    (every window, every word start labelled), or each sentence truncated."""
    import tensorflow as tf
    import tf_keras

    from tasks.task_kinds import masked_token_losses

    ids = tf.cast(out["input_ids"].to_tensor(), tf.int32)
    labels = tf.cast(out["labels"].to_tensor(default_value=IGNORED), tf.int32)
    features = {"input_ids": ids, "token_type_ids": tf.zeros_like(ids),
                "attention_mask": tf.cast(ids > 0, tf.int32)}
    optimizer = tf_keras.optimizers.Adam(3e-3)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            sums, counts = masked_token_losses(labels, model(features, training=True))
            loss = tf.reduce_sum(sums) / tf.reduce_sum(counts)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for _ in range(steps):
        step()


def raw_text(words: list[str]) -> str:
    return "  ".join(words)  # two spaces: offsets are counted, not word indexes


def spans_of(text: str, words: list[str], tags: list[int]) -> list[list]:
    """The true entities of `raw_text(words)`: [type, start, end, word] in characters."""
    places = [m.span() for m in re.finditer(r"\S+", text)]
    found = []
    for (start, end), tag in zip(places, tags):
        if tag == 2:
            found[-1][2] = end
        elif tag == 1:
            found.append(["X", start, end])
    return [[kind, start, end, text[start:end]] for kind, start, end in found]


def test_entities_past_max_seq_length_are_learned_with_windows_and_lost_by_truncation(
        vocab, tmp_path):
    import tensorflow as tf

    from tasks.steps import export
    from tasks.task_kinds import kind

    model_dir = write_tiny_model(tmp_path / "model", seed=1)
    words, tags = end_entities(64, seed=1)
    held_out, truth = end_entities(16, seed=2)
    texts = [raw_text(w) for w in held_out]
    want = [spans_of(t, w, g) for t, w, g in zip(texts, held_out, truth)]
    saved = {}
    for mode, stride in (("window", 3), ("truncate", None)):
        tf.keras.utils.set_random_seed(0)
        model = token_model(model_dir)
        enc = aligner(model_dir / "vocab.txt", 12, stride)
        train(model, enc.align(ragged(words, tf.string), ragged(tags, tf.int64)))
        # The export step's module: with the run's (overlap, aggregation) when windowed.
        module = export.serving_module(enc.encoder, model, TAGS, False,
                                       kind("token_classification"),
                                       window=None if stride is None else (stride, "mean"))
        saved[mode] = str(tmp_path / f"saved-{mode}")
        export.save_serving(module, saved[mode])
    found = served_in_fresh_process(saved, texts)
    # Truncated, the entities' words are never trained on nor read: none is found.
    assert all(entities == [] for entities in found["truncate"])
    # Windowed, the served entities are the true ones, at their character offsets.
    right = sum(got == entities for got, entities in zip(found["window"], want))
    assert right >= 15, (found["window"], want)
    assert sum(len(w) for w in want) > len(want) and any(t == 2 for row in truth for t in row)


def served_in_fresh_process(saved: dict[str, str], texts: list[str]) -> dict[str, list]:
    """Each signature loaded by one new interpreter (nothing of this process's graphs or
    tasks' modules): [type, start, end, word] of each text's entities, by `saved`'s key."""
    script = (
        "import json, sys\nimport tensorflow as tf\nimport tensorflow_text  # noqa: F401\n"
        "saved, texts = json.loads(sys.stdin.read())\nfound = {}\n"
        "for name, folder in saved.items():\n"
        "    serve = tf.saved_model.load(folder).signatures['serving_default']\n"
        "    out = {k: v.numpy() for k, v in serve(text=tf.constant(texts)).items()}\n"
        "    found[name] = [[[out['entity_group'][i][j].decode(), int(out['start'][i][j]),"
        " int(out['end'][i][j]), out['word'][i][j].decode()]"
        " for j in range(out['num_entities'][i])] for i in range(len(texts))]\n"
        "print(json.dumps(found))\n")
    done = subprocess.run([sys.executable, "-c", script], input=json.dumps([saved, texts]),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

