"""Fixtures for the training tests: a tiny random BERT checkpoint and a tiny, trivially
learnable tokenized dataset written as the tokenize step would (TFRecords + manifest), so the
tests do not depend on the tokenize step.

Also runnable as a script, to run steps in a fresh process (logical CPU devices can only be
configured before TensorFlow starts): `python tests/train_helpers.py RUN_DIR train evaluate`.
"""
from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tasks.io import storage  # noqa: E402  (importing tasks sets TF_USE_LEGACY_KERAS)
from tasks.config import RunConfig  # noqa: E402
from tasks.runs.runlayout import (RunContext, read_manifest, read_run_config,  # noqa: E402
                             write_manifest, write_run_config)

LABELS = ["neg", "pos"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]
CLS, SEP = 2, 3
# Each label draws its words from its own half of the vocabulary: learnable in a few steps.
WORDS = ((5, 52), (52, len(VOCAB)))


def write_tiny_model(model_dir: Path, model_type: str = "bert", seed: int = 0,
                     **config) -> Path:
    """A random 2-layer, hidden-32 encoder of `model_type` with a 2-label head, saved as
    bertflow saves a trained model (a Hugging Face folder: config.json, model.safetensors,
    vocab.txt). The head's labels are unnamed unless `id2label` is given. The weights are
    drawn from `seed`: tests that assert what training reaches must not depend on the draw
    (an unseeded draw made them fail about one run in twenty)."""
    from tasks.model.random_checkpoint import save_random_classifier

    id2label = config.pop("id2label", None) or {0: "LABEL_0", 1: "LABEL_1"}
    if model_type == "distilbert":
        shape = dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64)
    else:
        shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64)
    raw = {"model_type": model_type, "vocab_size": len(VOCAB), "max_position_embeddings": 64,
           **shape, **config}
    save_random_classifier(raw, seed, [id2label[i] for i in range(len(id2label))], model_dir)
    (model_dir / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Import into a test module to use (conftest.py belongs to the orchestration tests)."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def tiny_batch():
    """Two rows for the tiny model, one padded: for tests that compare models layer by layer."""
    import tensorflow as tf
    return {"input_ids": tf.constant([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]]),
            "token_type_ids": tf.constant([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]),
            "attention_mask": tf.constant([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])}


def logits_and_gradients(model, batch) -> tuple:
    """Inference-mode logits and the cross-entropy gradients (labels 0, 1) as numpy."""
    import tensorflow as tf
    labels = tf.constant([0, 1])
    with tf.GradientTape() as tape:
        logits = model(batch, training=False)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    grads = tape.gradient(loss, model.trainable_variables)
    return logits.numpy(), [tf.convert_to_tensor(g).numpy() for g in grads]


def tiny_rows(n: int, seed: int, min_len: int = 3, max_len: int = 20,
              task: str = "classification") -> list[tuple]:
    """(input_ids, token_type_ids, label) with the label given away by the words.

    multi_label: rows of lower words, upper words or both, labelled by the halves their
    words come from; regression: the share of the words from
    the upper half (a score in [0, 1]); token_classification: each word tagged by its half
    (TAGS: a run of upper words is one entity), one label per piece, IGNORED on [CLS] and
    [SEP] (every tiny word is one piece)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        count = rng.randint(min_len, max_len)
        if task == "classification":
            words = [rng.randrange(*WORDS[label]) for _ in range(count)]
        else:  # halves mixed by a per-row share
            share = (i % 3) / 2 if task == "multi_label" else (i % 5) / 4
            words = [rng.randrange(*WORDS[int(rng.random() < share)]) for _ in range(count)]
        ids = [CLS] + words + [SEP]
        if task == "token_classification":
            upper = [w >= WORDS[1][0] for w in words]
            tags = [0 if not up else 2 if j and upper[j - 1] else 1
                    for j, up in enumerate(upper)]
            label = [IGNORED] + tags + [IGNORED]
        elif task == "multi_label":
            upper = sum(w >= WORDS[1][0] for w in words)
            label = [float(upper < count), float(upper > 0)]
        elif task == "regression":
            label = [sum(w >= WORDS[1][0] for w in words) / count]
        rows.append((ids, [0] * len(ids), label))
    return rows


MULTI_LABELS = ["lower", "upper"]
TAGS = ["O", "B-UP", "I-UP"]
IGNORED = -100


def write_tfrecords(path: Path, rows: list[tuple]) -> None:
    import tensorflow as tf

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    def label_feature(label):
        if isinstance(label, list) and isinstance(label[0], int):  # a tag id per piece
            return ints(label)
        if isinstance(label, list):  # float labels: multi-hot or a score
            return tf.train.Feature(float_list=tf.train.FloatList(value=label))
        return ints([label])

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for ids, types, label in rows:
            example = tf.train.Example(features=tf.train.Features(feature={
                "input_ids": ints(ids), "token_type_ids": ints(types),
                "label": label_feature(label)}))
            writer.write(example.SerializeToString())


def write_tokenized(ctx: RunContext, num_train: int, num_eval: int, num_shards: int = 2,
                    max_seq_length: int = 32, train_lengths: tuple[int, int] = (3, 20),
                    task: str = "classification", num_validation: int = 0) -> str:
    """Shards under the cache folder plus tokenize/manifest.json, as CONTRACTS.md describes.
    `train_lengths`: (min, max) words per training row; equal values give every batch the same
    shape, so a training function is traced once (faster multi-process tests).
    `num_validation`: rows of a validation split (none when 0)."""
    from tasks.task_kinds import kind as task_kind

    labels = {"multi_label": MULTI_LABELS, "regression": ["score"],
              "token_classification": TAGS}.get(task, LABELS)
    cache = Path(ctx.artifact_root) / "cache" / "tfrecords" / "tiny"
    splits = {}
    for split, n, seed in (("train", num_train, 1), ("eval", num_eval, 2),
                           ("validation", num_validation, 3)):
        if not n:
            continue
        rows = tiny_rows(n, seed, *(train_lengths if split == "train" else (3, 20)), task=task)
        shards = []
        for k in range(num_shards):
            path = cache / f"{split}-{k:05d}-of-{num_shards:05d}.tfrecord"
            write_tfrecords(path, rows[k::num_shards])
            shards.append(str(path))
        splits[split] = {"shards": shards, "num_examples": n, "num_truncated": 0,
                         "length_histogram": {"edges": [], "counts": []}}
    return write_manifest(ctx.step_uri("tokenize"), {
        "content_hash": "tiny", "cache_uri": str(cache), "reused": False,
        "vocab_size": len(VOCAB), "max_seq_length": max_seq_length, "lower_case": True,
        "has_pair": False, "task": task, "labels": labels,
        "label_spec": task_kind(task).label_spec(len(labels)), "splits": splits})


def make_run(root: Path, model_dir: Path, num_train: int = 128, num_eval: int = 41,
             train_lengths: tuple[int, int] = (3, 20), num_validation: int = 0,
             **overrides) -> tuple[RunConfig, RunContext]:
    """A run folder with config.json, context.json and tokenized data, ready for train.
    float32 unless a test asks otherwise: tests compare weights to tight tolerances, and
    `auto` would pick bfloat16 on some CPUs and not on others."""
    values = dict(base_model=str(model_dir), artifact_root=str(root), max_seq_length=32,
                  per_replica_batch_size=16, epochs=3, learning_rate=1e-2, warmup_ratio=0.1,
                  weight_decay=0.0, eval_batch_size=8, checkpoint_every_steps=10,
                  mixed_precision="none")
    values.update(overrides)
    cfg = RunConfig(**values)
    ctx = RunContext(artifact_root=str(root), dag_id="test", run_key="run1")
    write_run_config(ctx, cfg)
    storage.write_json(f"{ctx.run_uri}/context.json", ctx.to_dict())
    write_tokenized(ctx, num_train, num_eval, max_seq_length=cfg.max_seq_length,
                    train_lengths=train_lengths, task=cfg.task, num_validation=num_validation)
    return cfg, ctx


def saved_weights(model_dir: Path) -> dict:
    """Parameter name -> value from the model.safetensors a train step wrote."""
    from safetensors.numpy import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))


def run_steps_in_subprocess(run_dir: str, *steps: str, env: dict | None = None,
                            timeout: int = 300) -> subprocess.CompletedProcess:
    """Each step as `python -m tasks STEP --run-dir RUN`, forked from the session's warm-start
    server (tests/conftest.py) when it serves this environment: a fresh interpreter spends
    seconds of CPU importing TensorFlow per call, a fork milliseconds. Without a server, or
    with `env` changing an import-time variable, the steps left run in one fresh interpreter
    (this file as a script). A forked step has one stream: it is in stdout and stderr both."""
    from tasks.provision.local import warm_start
    from tasks.provision.spec import process_env

    full_env = process_env(os.environ, env or {})  # as LocalCluster builds a step's: served warm
    output, code = "", 0
    for k, step in enumerate(steps):
        argv = [sys.executable, "-m", "tasks", step, "--run-dir", str(run_dir)]
        proc = warm_start.spawn(argv, full_env, ROOT)
        if proc is None:
            done = subprocess.run([sys.executable, __file__, str(run_dir), *steps[k:]],
                                  env=full_env, capture_output=True, text=True,
                                  timeout=timeout)
            return subprocess.CompletedProcess(done.args, done.returncode,
                                               output + done.stdout, output + done.stderr)
        timer = threading.Timer(timeout, _kill_group, (proc.pid,))
        timer.start()
        try:
            output += proc.stdout.read()
            code = proc.wait()
        finally:
            timer.cancel()
            proc.stdout.close()
        if code:
            break
    return subprocess.CompletedProcess(list(steps), code, output, output)


def _kill_group(pid: int) -> None:
    """A forked step that overran its timeout (its own process group, as LocalCluster's)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def copy_checkpoint(source: Path, target: Path, drop: str = "", files: dict | None = None,
                    **config) -> Path:
    """A copy of checkpoint folder `source` in `target`, without file `drop`, with `files`
    {name: text} written and `config` keys set in its config.json."""
    target.mkdir()
    for path in source.iterdir():
        if path.name != drop:
            (target / path.name).write_bytes(path.read_bytes())
    for name, text in (files or {}).items():
        (target / name).write_text(text)
    raw = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**raw, **config}))
    return target


def refusals_of_a_family(model_dir: Path, tmp_path: Path, model_file: str, family: str,
                         ids: int) -> None:
    """validate's checks of a checkpoint whose tokenizer is the one file `model_file` with
    `ids` ids: `model_dir` passes; without that file, or with an embedding one row short of
    the vocabulary, it is refused naming the file."""
    from tasks.errors import BertflowError, ConfigError
    from tasks.training import checkpoint, checkpoint_sources

    checkpoint.check_model_dir(model_dir)
    assert checkpoint_sources.check(RunConfig(base_model=str(model_dir))) == str(model_dir)
    broken = copy_checkpoint(model_dir, tmp_path / "broken", drop=model_file)
    with pytest.raises(BertflowError, match=f"missing {model_file} \\(a {family} checkpoint's "
                                            f"tokenizer is {model_file}"):
        checkpoint.check_model_dir(broken)
    with pytest.raises(ConfigError, match=model_file):
        checkpoint_sources.check(RunConfig(base_model=str(broken)))
    small = copy_checkpoint(model_dir, tmp_path / "small", vocab_size=ids - 1)
    with pytest.raises(ConfigError, match=f"{model_file} has {ids} ids but config.json's "
                                          f"vocab_size .* is {ids - 1}"):
        checkpoint_sources.check(RunConfig(base_model=str(small)))


def steps_of_a_family(model_dir: Path, tmp_path: Path, texts: list[str], reference,
                      max_len: int = 24) -> tuple[dict, Path, list[str]]:
    """A tiny checkpoint through data, tokenize, train and evaluate (a subprocess, as the CLI
    runs them) and export (which checks the SavedModel in a fresh interpreter), on `texts`
    labelled a/b in turn. Checks that the TFRecords hold `reference`'s ids (a transformers
    tokenizer of the same files) and no token types. Returns (tokenize manifest, exported
    version folder, the texts as the data step prepared them)."""
    import tensorflow as tf

    from tasks.steps import data, export, tokenize

    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\n" + "".join(
        f"{t.replace(chr(9), ' ').replace(chr(10), ' ').replace(chr(13), ' ')}\t{'ab'[i % 2]}\n"
        for i, t in enumerate(texts)))
    root = tmp_path / "art"
    cfg = RunConfig(base_model=str(model_dir), train_uri=str(train), num_shards=1,
                    artifact_root=str(root), max_seq_length=max_len, epochs=1,
                    per_replica_batch_size=8, eval_batch_size=8, mixed_precision="none",
                    model_name="tiny-family",
                    export_uri=str(tmp_path / "models"))
    ctx = RunContext(artifact_root=str(root), dag_id="test", run_key="family")
    write_run_config(ctx, cfg)
    storage.write_json(f"{ctx.run_uri}/context.json", ctx.to_dict())  # for the subprocess
    data.run(cfg, ctx)
    manifest = json.loads(Path(tokenize.run(cfg, ctx)).read_text())
    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(
        manifest["splits"]["train"]["shards"] + manifest["splits"]["eval"]["shards"])]
    stored = {tuple(r.features.feature["input_ids"].int64_list.value) for r in records}
    # The data step strips each text's ends.
    prepared = [row.split("\t")[0].strip() for row in train.read_text().splitlines()[1:]]
    assert stored == {tuple(reference(t, truncation=True, max_length=max_len)["input_ids"])
                      for t in prepared}
    assert not any(any(r.features.feature["token_type_ids"].int64_list.value)
                   for r in records)
    done = run_steps_in_subprocess(ctx.run_uri, "train", "evaluate", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    version = read_manifest(export.run(cfg, ctx))
    return manifest, Path(version["version_uri"]), prepared


def run_cluster(cfg, ctx, step: str, **kwargs) -> list[str]:
    """Run one step's WorkerSpec (as the provision step would write it) on loopback with
    the local backend; its log lines."""
    from tasks.errors import WorkerError
    from tasks.provision.local.cluster import LocalCluster
    from tasks.provision.spec import distributed_spec

    lines: list[str] = []
    spec = distributed_spec(cfg, step, ctx.run_uri)
    try:
        LocalCluster(spec, log=lines.append, grace_seconds=60, **kwargs).run()
    except WorkerError as err:
        raise AssertionError(f"{step} failed: {err}\n" + "\n".join(lines[-60:])) from None
    return lines


def single_device_matrix(model_dir: Path, ctx, batch_size: int = 8, split: str = "eval"):
    """The reference: the same checkpoint evaluated in this process on one device (its
    confusion matrix on `split`)."""
    import tensorflow as tf
    import tf_keras

    from tasks.training import checkpoint, inputs
    from tasks.steps import evaluate

    tf_keras.mixed_precision.set_global_policy("float32")
    tok = read_manifest(ctx.manifest_uri("tokenize"))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = checkpoint.load_classifier(model_dir, LABELS)
    with inputs.local_shards(tok, split) as files:
        return evaluate.confusion_matrix(strategy, model, files, len(LABELS), batch_size)


def main(argv: list[str]) -> None:
    from tasks.__main__ import STEPS

    run_dir, steps = argv[0], argv[1:]
    cfg = read_run_config(f"{run_dir}/config.json")
    ctx = RunContext(**json.loads(Path(run_dir, "context.json").read_text()))
    for step in steps:
        module = importlib.import_module(STEPS[step])
        print(f"{step} manifest: {module.run(cfg, ctx)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])


# Token classification for a family's tokenizer: CoNLL-like sentences with capitals, accents,
# CJK and punctuation as words of their own (a CoNLL word holds no whitespace).
NAMES = ["José", "Zoë", "ÅSA", "Müller", "田中", "O'Neil", "Théo", "Eloïse", "Pablo"]
PLACES = [["São", "Paulo"], ["Zürich"], ["東京"], ["New", "York"], ["Ångström-by"], ["Paris"]]
FILLER = ["the", "Quick", "fox's", "café", "visited", ",", "!!", "über", "und", "était",
          "2024-01-31", "。", "est", "très", "niño", "(nested)", "中文", "RÉSUMÉ", "saw", "and"]
# Served texts for the pipeline comparison: words whose first piece in the tests' tiny
# SentencePiece models is neither a lone "▁" nor unknown. transformers' pipeline has no
# continuing-subword prefix to find words by for SentencePiece and falls back to a heuristic
# that would take such a piece for a word of its own. No word holds punctuation either:
# BERT's pre-tokenizer would split it ("fox's" is three words to the pipeline, one to
# bertflow). So the words here are the whitespace split in both, for every family.
SERVED = ["Théo visited Paris today", "Eloïse and Pablo saw São Paulo", "Pablo saw the café"]


def tagged_sentences(n: int, seed: int, names: list[str] = NAMES,
                     places: list[list[str]] = PLACES, filler: list[str] = FILLER,
                     most: int = 14) -> list[tuple[list[str], list[str]]]:
    """`n` seeded sentences of 3 to `most` draws: a name (PER), a place (LOC) or filler (O)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(rng.randint(3, most)):
            pick = rng.random()
            if pick < 0.2:
                words.append(rng.choice(names))
                tags.append("B-PER")
            elif pick < 0.35:
                place = rng.choice(places)
                words += place
                tags += ["B-LOC"] + ["I-LOC"] * (len(place) - 1)
            else:
                words.append(rng.choice(filler))
                tags.append("O")
        out.append((words, tags))
    return out


def first_piece_labels(reference, sentences: list[list[str]], tag_ids: list[list[int]],
                       max_len: int) -> tuple[list[list[int]], list[list[int]], list[list]]:
    """transformers' run_ner labelling: (input_ids, labels, word starts) of `reference` (a
    transformers tokenizer) called with is_split_into_words=True and truncation; the word's
    tag id on its first piece (word_ids()), IGNORED on the others; a word's start is the
    position of its first piece, -1 when truncated away."""
    encoded = reference(sentences, is_split_into_words=True, truncation=True,
                        max_length=max_len)
    labels, starts = [], []
    for i, tags in enumerate(tag_ids):
        word_ids, row = encoded.word_ids(i), []
        for j, word in enumerate(word_ids):
            first = word is not None and (j == 0 or word_ids[j - 1] != word)
            row.append(tags[word] if first else IGNORED)
        labels.append(row)
        starts.append([word_ids.index(w) if w in word_ids else -1 for w in range(len(tags))])
    return encoded["input_ids"], labels, starts


def aligned_as_transformers(model_dir: Path, reference) -> None:
    """The family's WordPieceAligner (tasks/model/token_encoding.py) gives `reference`'s
    is_split_into_words ids, first-piece labels and word starts on tagged_sentences, whole
    and truncated to 12 pieces."""
    import tensorflow as tf

    from tasks.model.token_encoding import WordPieceAligner
    from tasks.training import checkpoint

    sentences = tagged_sentences(40, seed=3)
    words = [w for w, _ in sentences]
    names = sorted({t for _, tags in sentences for t in tags})
    tag_ids = [[names.index(t) for t in tags] for _, tags in sentences]
    truncated = 0
    for max_len in (512, 12):
        aligner = WordPieceAligner(checkpoint.text_encoder(model_dir, False, max_len))
        out = aligner.align(tf.ragged.constant(words), tf.ragged.constant(tag_ids, tf.int64))
        ids, labels, starts = first_piece_labels(reference, words, tag_ids, max_len)
        assert out["input_ids"].to_list() == ids
        assert out["labels"].to_list() == labels
        assert out["word_starts"].to_list() == starts
        truncated += int(out["num_truncated"])
    assert truncated > 0  # the 12-piece run cut sentences, some words lost their labels


def token_records_of_a_family(model_dir: Path, tmp_path: Path, reference,
                              max_len: int = 24) -> tuple[RunConfig, RunContext]:
    """A tiny checkpoint through data and tokenize for token_classification on a CoNLL train
    file and a JSON Lines eval file of tagged_sentences, some cut at `max_len`. Checks that
    the TFRecords hold `reference`'s is_split_into_words ids and first-piece labels
    (first_piece_labels). Returns the run's (config, context), ready for train."""
    import tensorflow as tf

    from tasks.steps import data, tokenize

    train, dev = tagged_sentences(160, seed=1), tagged_sentences(24, seed=2)
    (tmp_path / "train.conll").write_text("".join(
        "".join(f"{w}\t{t}\n" for w, t in zip(words, tags)) + "\n" for words, tags in train))
    (tmp_path / "dev.jsonl").write_text("".join(
        json.dumps({"tokens": w, "tags": t}) + "\n" for w, t in dev))
    root = tmp_path / "art"
    cfg = RunConfig(base_model=str(model_dir), task="token_classification",
                    train_uri=str(tmp_path / "train.conll"), eval_uri=str(tmp_path / "dev.jsonl"),
                    num_shards=1, artifact_root=str(root), max_seq_length=max_len, epochs=20,
                    per_replica_batch_size=16, learning_rate=1e-2, eval_batch_size=32,
                    mixed_precision="none", model_name="tiny-ner",
                    export_uri=str(tmp_path / "models"))
    ctx = RunContext(artifact_root=str(root), dag_id="test", run_key="ner")
    write_run_config(ctx, cfg)
    storage.write_json(f"{ctx.run_uri}/context.json", ctx.to_dict())  # for the subprocess
    labels = json.loads(Path(data.run(cfg, ctx)).read_text())["labels"]
    manifest = json.loads(Path(tokenize.run(cfg, ctx)).read_text())
    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(
        manifest["splits"]["train"]["shards"] + manifest["splits"]["eval"]["shards"])]
    stored = {(tuple(r.features.feature["input_ids"].int64_list.value),
               tuple(r.features.feature["label"].int64_list.value)) for r in records}
    words = [w for w, _ in train + dev]
    ids, piece_labels, _ = first_piece_labels(
        reference, words, [[labels.index(t) for t in tags] for _, tags in train + dev],
        max_len)
    assert stored == set(zip(map(tuple, ids), map(tuple, piece_labels)))
    assert manifest["splits"]["train"]["num_truncated"] > 0  # truncation is exercised
    return cfg, ctx


def token_steps_of_a_family(model_dir: Path, tmp_path: Path, reference,
                            max_len: int = 24) -> tuple[Path, dict]:
    """token_records_of_a_family, then train and evaluate (a subprocess, as the CLI runs
    them) and export (which checks the SavedModel in a fresh interpreter). Returns (version
    folder, evaluate's metrics)."""
    from tasks.steps import export

    cfg, ctx = token_records_of_a_family(model_dir, tmp_path, reference, max_len)
    done = run_steps_in_subprocess(ctx.run_uri, "train", "evaluate", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_manifest(ctx.manifest_uri("evaluate"))["metrics"]
    version = read_manifest(export.run(cfg, ctx))
    return Path(version["version_uri"]), metrics


def served_entities(version: Path, texts: list[str]) -> list[list[dict]]:
    """The exported SavedModel's entities of `texts`, served in a fresh interpreter that
    imports only tensorflow and tensorflow_text (tasks/fresh_load.py)."""
    from tasks import fresh_load
    from tasks.provision.local import warm_start

    out = fresh_load.predict(str(version / "saved_model"), {"text": texts},
                             warm_start.start_fresh_load)
    return [[{key: out[key][i][j] for key in ("entity_group", "word", "start", "end", "score")}
             for j in range(int(out["num_entities"][i]))] for i in range(len(texts))]


def entities_as_the_pipeline(version: Path, architecture: str,
                             texts: list[str] = SERVED, within: set | None = None) -> None:
    """The SavedModel serves raw strings (`texts`) in a fresh process with entities whose
    character offsets slice the text to the entity's word, and the Hugging Face export
    loads in transformers' pipeline("ner", aggregation_strategy="first") (PyTorch), which
    finds the same entities. `within`: words of which some served entity must be made."""
    import torch_env

    served = served_entities(version, texts)
    assert any(served), served  # the trained model finds some entity
    assert within is None or any(set(e["word"].split()) <= within for row in served
                                 for e in row), (served, within)
    for text, entities in zip(texts, served):
        for entity in entities:
            assert text[int(entity["start"]):int(entity["end"])] == entity["word"], entity
    assert json.loads((version / "config.json").read_text())["architectures"] == [architecture]
    try:
        torch_env.python()
    except torch_env.Unavailable as err:
        pytest.skip(str(err))
    theirs = torch_env.ner(str(version), texts)
    for text, ours, pipeline in zip(texts, served, theirs):
        # DeBERTa's offsets count the space before a word in its first piece: the pipeline's
        # entity starts there. Its `word` joins a SentencePiece entity's words without a
        # space ("SãoPaulo"): the spans are compared, not the pipeline's words.
        starts = [e["start"] + len(text[e["start"]:e["end"]]) - len(
            text[e["start"]:e["end"]].lstrip()) for e in pipeline]
        assert [(e["entity_group"], int(e["start"]), int(e["end"])) for e in ours] \
            == [(e["entity_group"], start, e["end"]) for e, start in zip(pipeline, starts)], \
            (text, ours, pipeline)
        assert [e["score"] for e in ours] == pytest.approx([e["score"] for e in pipeline],
                                                           abs=1e-4), (text, ours, pipeline)
