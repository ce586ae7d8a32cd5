"""Export: tiny random BERT + the project's encoder -> SavedModel -> published version, on
local disk, the GCS emulator and moto's S3 server; downloaded back and loaded."""
from __future__ import annotations

import hashlib
import json
import subprocess

import numpy as np
import pytest

import tasks
from storage_servers import (S3_SECRET, connections, gcs_emulator, root,  # noqa: F401
                             s3_server)
from tasks.runs import lineage
from tasks.steps import export
from tasks.runs import runlayout
from tasks.io import storage
from tasks.config import parse_config
from tasks.runs.runlayout import RunContext
from train_helpers import write_tiny_model

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "the", "and", "short", "sentence",
         "to", "check", "model", "second", "different", "one", "good", "bad", "movie", ",",
         "export", "##ed", "##s"]
LABELS = ["negative", "positive"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A fine-tuned model folder as the train step writes it, with random tiny weights."""
    return write_model(tmp_path_factory.mktemp("train") / "model")


def write_model(path, model_type: str = "bert", labels=LABELS, **config):
    """A classifier of `model_type` with the run's labels, as the train step saves it."""
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    write_tiny_model(path, model_type, id2label=dict(enumerate(labels)), **config)
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")  # real words for the texts
    return path


TASK_LABELS = {"classification": LABELS, "multi_label": ["sport", "news", "weather"],
               "regression": ["score"]}
TASK_METRICS = {
    "multi_label": {"micro_f1": 0.6, "macro_f1": 0.5, "subset_accuracy": 0.25, "threshold": 0.5,
                    "per_label": {label: {"precision": 0.5, "recall": 1.0, "f1": 0.67,
                                          "support": 2} for label in TASK_LABELS["multi_label"]}},
    "regression": {"pearson": 0.9, "spearman": 0.8, "mse": 0.1,
                   "binned": {"edges": [0, 0.5, 1], "rows": [
                       {"low": 0, "high": 0.5, "count": 3, "mean_true": 0.2,
                        "mean_predicted": 0.3},
                       {"low": 0.5, "high": 1, "count": 0, "mean_true": None,
                        "mean_predicted": None}]}}}


def fake_run(tmp_path, model_dir, has_pair=False, run_id="manual__1",
             task="classification") -> RunContext:
    """Upstream manifests of a finished run, as data/tokenize/train/evaluate write them."""
    ctx = RunContext(str(tmp_path / "artifacts"), "bert_finetune", run_id, run_id)
    labels = TASK_LABELS[task]
    metrics = {"accuracy": 0.75, "macro_f1": 0.7, "num_examples": 4, "labels": LABELS,
               "per_class": {label: {"precision": 0.5, "recall": 1.0, "f1": 0.67,
                                     "support": 2} for label in LABELS},
               "confusion_matrix": [[2, 0], [1, 1]]}
    if task != "classification":
        metrics = {"task": task, "num_examples": 4, "labels": labels, **TASK_METRICS[task]}
    storage.write_json(f"{ctx.step_uri('evaluate')}/metrics.json", metrics)
    runlayout.write_manifest(ctx.step_uri("data"), {
        "task": task, "labels": labels, "has_pair": has_pair, "eval_source": "file",
        "sources": {"train": {"uri": "s3://data/train.csv", "sha256": "ab" * 32},
                    "eval": None}})
    runlayout.write_manifest(ctx.step_uri("tokenize"), {
        "content_hash": "cd" * 32, "max_seq_length": 32, "lower_case": True,
        "has_pair": has_pair, "labels": labels, "task": task})
    runlayout.write_manifest(ctx.step_uri("train"), {
        "model_dir": str(model_dir), "strategy": "one_device", "num_replicas": 1,
        "global_batch_size": 8, "epochs": 1, "steps": 2, "learning_rate": 5e-5,
        "final_loss": 0.69, "base_model": str(model_dir)})
    runlayout.write_manifest(ctx.step_uri("evaluate"), {
        "metrics_uri": f"{ctx.step_uri('evaluate')}/metrics.json",
        "metrics": {"accuracy": 0.75, "macro_f1": 0.7}, "num_examples": 4})
    return ctx


def git_head() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=lineage.PROJECT_ROOT, check=True).stdout.strip()


def test_a_recorded_base_checkpoint_is_taken_as_the_train_step_wrote_it():
    recorded = {"source": "hf://bert-base-uncased", "revision": "86b5e09", "sha256": "ef" * 32}
    cfg = parse_config({})
    # As the train step writes it: the folder in base_model, the resolved source beside it.
    train = {"base_model": "/cache/checkpoints/abc", "base_checkpoint": recorded}
    assert lineage.base_checkpoint(cfg, train) == recorded


def predict(saved_model_dir, **inputs):
    import tensorflow as tf

    serve = tf.saved_model.load(str(saved_model_dir)).signatures["serving_default"]
    return serve(**{k: tf.constant(v) for k, v in inputs.items()})


def test_export_publishes_a_loadable_version(root, tmp_path, model_dir):
    """Published to each backend, downloaded back: complete, checksummed, predicts names."""
    ctx = fake_run(tmp_path, model_dir)
    cfg = parse_config({"artifact_root": ctx.artifact_root, "export_uri": f"{root}/models",
                        "model_name": "tiny", "aws_conn_id": "bertflow_s3"})
    manifest = runlayout.read_manifest(export.run(cfg, ctx))

    assert manifest["inputs"] == ["text"] and manifest["published"] is True
    assert manifest["version_uri"] == f"{root}/models/tiny/{manifest['version']}"
    assert storage.is_complete(manifest["version_uri"])
    local = tmp_path / "downloaded"
    storage.download_dir(manifest["version_uri"], local)
    complete = json.loads((local / storage.COMPLETE).read_text())
    assert {f["path"] for f in complete["files"]} >= {
        "labels.json", "metrics.json", "model_card.md", "saved_model/saved_model.pb"}
    for entry in complete["files"]:
        data = (local / entry["path"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["size"],
                                                                  entry["sha256"])
    out = predict(local / "saved_model", text=["a good movie", "a bad one , the end"])
    assert out["probabilities"].shape == (2, 2)
    # Stock ops only: serving needs no bertflow kernel library (tasks/model/cpu_kernels).
    assert b"Bertflow" not in (local / "saved_model" / "saved_model.pb").read_bytes()
    assert {x.decode() for x in out["label"].numpy()} <= set(LABELS)

    card = (local / "model_card.md").read_text()
    for fact in ("bert_finetune", "manual__1", "cd" * 32, "ab" * 32, "accuracy: 0.7500"):
        assert fact in card
    # Lineage: what the run's manifests say produced this version, also in the card.
    record = json.loads((local / "lineage.json").read_text())
    assert record["data"] == {"train": {"uri": "s3://data/train.csv", "sha256": "ab" * 32,
                                        "files": []}}
    assert record["tfrecord_cache_key"] == "cd" * 32
    assert record["config"] == json.loads(cfg.to_json())
    weights = hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert record["base_model"] == {"source": lineage.DEFAULT_SOURCE, "path": str(model_dir),
                                    "weights": "model.safetensors", "sha256": weights}
    assert record["code"] == {"bertflow": tasks.__version__, "git_commit": git_head()}
    assert (record["dag_id"], record["run_id"]) == ("bert_finetune", "manual__1")
    assert record["metrics"] == {"accuracy": 0.75, "macro_f1": 0.7, "num_examples": 4}
    assert record["version_uri"] == manifest["version_uri"]
    assert f"sha256 `{weights}`" in card and git_head() in card and '"model_name": "tiny"' in card
    # The S3 secret reached the client through the Airflow connection only.
    written = [p for d in (local, tmp_path / "artifacts") for p in d.rglob("*") if p.is_file()]
    assert not [p for p in written if S3_SECRET.encode() in p.read_bytes()]


def test_retry_reuses_the_version_and_leaves_it_untouched(tmp_path, model_dir):
    ctx = fake_run(tmp_path, model_dir)
    cfg = parse_config({"artifact_root": ctx.artifact_root, "model_name": "tiny"})
    first = runlayout.read_manifest(export.run(cfg, ctx))
    complete_uri = f"{first['version_uri']}/{storage.COMPLETE}"
    before = storage.read_bytes(complete_uri)

    again = runlayout.read_manifest(export.run(cfg, ctx))
    assert again["version"] == first["version"] and again["published"] is False
    assert storage.read_bytes(complete_uri) == before
    assert storage.list_uris(f"{ctx.artifact_root}/models/tiny") == storage.list_uris(
        first["version_uri"])


def test_pair_task_serves_text_and_text_pair(tmp_path, model_dir):
    ctx = fake_run(tmp_path, model_dir, has_pair=True)
    cfg = parse_config({"artifact_root": ctx.artifact_root, "model_name": "pairs"})
    manifest = runlayout.read_manifest(export.run(cfg, ctx))
    assert manifest["inputs"] == ["text", "text_pair"]
    out = predict(f"{manifest['version_uri']}/saved_model",
                  text=["a good movie"], text_pair=["the second one"])
    assert out["probabilities"].shape == (1, 2)


def test_versions_differ_between_runs_and_sort_by_time(tmp_path):
    first = export.version_for(RunContext(str(tmp_path), "d", "run-a", "run-a"))
    second = export.version_for(RunContext(str(tmp_path), "d", "run-b", "run-b"))
    assert first != second and first.split("-")[0] <= second.split("-")[0]
    assert export.version_for(RunContext(str(tmp_path), "d", "run-a", "run-a")) == first


@pytest.mark.parametrize("model_type", ["bert", "distilbert", "electra"])
def test_version_is_a_hugging_face_checkpoint_that_pytorch_loads(tmp_path, model_type):
    """The version folder's root is a standard HF checkpoint: PyTorch transformers loads it
    (in a venv with the torch CPU wheel and no TensorFlow) and gives the SavedModel's
    probabilities on the same texts, within 1e-5 (float32 on both sides), for each family.
    Weights drawn wide (initializer_range 1) so that the probabilities are far from uniform."""
    import numpy as np

    import torch_env

    try:
        torch_env.python()
    except torch_env.Unavailable as err:
        pytest.skip(str(err))
    # BERT's tanh pooler bounds what its head sees; DistilBERT's and ELECTRA's heads read the
    # first token unbounded and saturate the softmax at initializer_range 1 (1e-18).
    spread = 1.0 if model_type == "bert" else 0.3
    ctx = fake_run(tmp_path, write_model(tmp_path / "wide", model_type, initializer_range=spread))
    cfg = parse_config({"artifact_root": ctx.artifact_root, "model_name": "tiny"})
    version = runlayout.read_manifest(export.run(cfg, ctx))["version_uri"]
    names = {p.name for p in storage.local_path(version).iterdir()}
    assert names >= {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json",
                     "tokenizer_config.json", "saved_model"}
    config = json.loads(storage.read_text(f"{version}/config.json"))
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["label2id"] == {"negative": 0, "positive": 1}
    assert config["architectures"] == [{"bert": "BertForSequenceClassification",
                                        "distilbert": "DistilBertForSequenceClassification",
                                        "electra": "ElectraForSequenceClassification"}[model_type]]

    texts = ["a good movie", "the second one , and a bad exported model", "different"]
    got = torch_env.predict(version, texts)
    assert got["tokenizer"] == "BertTokenizer"  # transformers 5: the tokenizers-backed class
    assert got["id2label"] == {"0": "negative", "1": "positive"}
    want = predict(f"{version}/saved_model", text=texts)["probabilities"].numpy()
    np.testing.assert_allclose(got["probabilities"], want, atol=1e-5)
    # Not a trivial match: the texts' probabilities differ by 100x the tolerance at least (a
    # tiny random model's spread varies with its draw: 0.04 was seen).
    assert np.ptp(want[:, 0]) > 1e-3, want


@pytest.mark.parametrize("task", ["multi_label", "regression"])
def test_multi_label_and_regression_versions_serve_and_load_in_pytorch(tmp_path, task):
    """Multi-label: sigmoid `probabilities` and the `labels` over the threshold (padded with
    ""); regression: `score`. The HF checkpoint beside it carries problem_type, and PyTorch's
    AutoModelForSequenceClassification gives the same outputs (sigmoid / the raw score)."""
    import numpy as np

    import torch_env

    labels = TASK_LABELS[task]
    ctx = fake_run(tmp_path, write_model(tmp_path / "wide", labels=labels,
                                         initializer_range=1.0), task=task)
    cfg = parse_config({"artifact_root": ctx.artifact_root, "model_name": "tiny", "task": task})
    manifest = runlayout.read_manifest(export.run(cfg, ctx))
    version = manifest["version_uri"]
    assert manifest["task"] == task
    config = json.loads(storage.read_text(f"{version}/config.json"))
    texts = ["a good movie", "the second one , and a bad exported model", "different"]
    out = predict(f"{version}/saved_model", text=texts)
    card = storage.read_text(f"{version}/model_card.md")
    if task == "multi_label":
        assert manifest["outputs"] == ["labels", "probabilities"]
        assert config["problem_type"] == "multi_label_classification"
        probabilities = out["probabilities"].numpy()
        assert probabilities.shape == (3, 3) and not np.allclose(probabilities.sum(1), 1)
        names = out["labels"].numpy().astype(str)
        assert names.shape == (3, 3)
        for row, chosen in zip(probabilities, names):
            want = [label for label, p in zip(labels, row) if p > cfg.multi_label_threshold]
            assert list(chosen) == want + [""] * (3 - len(want))
        want = probabilities
        assert "| sport | 0.5000 |" in card and "micro F1: 0.6000" in card
    else:
        assert manifest["outputs"] == ["score"]
        assert config["problem_type"] == "regression" and config["id2label"] == {"0": "score"}
        want = out["score"].numpy()
        assert want.shape == (3,)
        assert "Pearson: 0.9000" in card and "| 0 to 0.5 | 3 | 0.2000 | 0.3000 |" in card
    try:
        torch_env.python()
    except torch_env.Unavailable as err:
        pytest.skip(f"the SavedModel checks passed; PyTorch's: {err}")
    got = torch_env.predict(version, texts)
    assert got["problem_type"] == config["problem_type"]
    # A score is an unbounded logit (about 3 here): float32 sums in another order differ
    # relatively, by ~3e-5 seen.
    np.testing.assert_allclose(got["probabilities"], want, atol=1e-5, rtol=1e-4)
    assert np.ptp(want.ravel()) > 1e-3, want


def _scoring_module(scale: float):
    """A SavedModel-able module whose serve scores texts by length x scale."""
    import tensorflow as tf

    module = tf.Module()
    module.serve = tf.function(
        lambda text: {"score": tf.cast(tf.strings.length(text), tf.float32) * scale},
        input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    return module


def test_the_fresh_load_check_starts_early_and_compares_predictions(tmp_path):
    """Its interpreter runs before the SavedModel exists (its imports overlap the export's
    work); it passes a SavedModel that predicts what the module predicts, and fails one
    that predicts otherwise, or that does not load, naming why."""
    import tensorflow as tf

    from tasks.errors import BertflowError

    saved = tmp_path / "saved_model"
    module = _scoring_module(1.0)
    with export.FreshLoadCheck() as fresh:
        assert fresh._proc.poll() is None  # started, waiting for the path
        tf.saved_model.save(module, str(saved), signatures={"serving_default": module.serve})
        fresh.check(saved, module.serve, has_pair=False)
    with export.FreshLoadCheck() as fresh, pytest.raises(BertflowError, match="predicts"):
        fresh.check(saved, _scoring_module(2.0).serve, has_pair=False)
    with export.FreshLoadCheck() as fresh, pytest.raises(BertflowError, match="does not load"):
        fresh.check(tmp_path / "missing", module.serve, has_pair=False)


def test_the_serving_graph_is_traced_once_for_the_save_and_the_check(tmp_path):
    """save_serving's trace is the one tf.saved_model.save uses, for the signature and the
    module's function alike, and the one the check runs: tracing the serving graph is
    most of an export's Python time. A TensorFlow whose save keys its traces otherwise fails
    here, not silently slower."""
    import tensorflow as tf

    traces = []
    module = tf.Module()
    module.scale = tf.Variable(2.0)

    def serve(text):
        traces.append(1)
        return {"score": tf.cast(tf.strings.length(text), tf.float32) * module.scale}

    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None], tf.string)])
    traced = export.save_serving(module, tmp_path / "m")
    assert traced(text=tf.constant(["abc"]))["score"].numpy().tolist() == [6.0]
    assert len(traces) == 1
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    assert loaded.signatures["serving_default"](text=tf.constant(["ab"]))["score"] == 4.0


def test_the_saved_model_keeps_the_tokenizer_table_and_none_of_its_unused_functions(tmp_path):
    """A RoBERTa's serving module tracks its byte-level BPE's lookup table, not the encoder:
    the save traces no tokenizer function that serving does not call (encode_pair, for a
    task of one text; tasks/model/saved_resources.py), and the loaded signature, which reads
    the table, serves."""
    import tensorflow as tf

    from family_checkpoints import tiny_roberta
    from tasks.task_kinds import kind
    from tasks.training import checkpoint

    folder = tiny_roberta(tmp_path)
    encoder = checkpoint.text_encoder(folder, False, 16)
    model = checkpoint.load_classifier(folder, ["a", "b"], head=kind("classification").head)
    module = export.serving_module(encoder, model, ["a", "b"], False)
    assert any(isinstance(t, tf.lookup.StaticHashTable) for t in module.tokenizer)
    serve = export.save_serving(module, tmp_path / "m")
    assert encoder.encode_pair.experimental_get_tracing_count() == 0
    loaded = tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]
    texts = tf.constant(["a short text", "and a second one"])
    np.testing.assert_allclose(loaded(text=texts)["probabilities"].numpy(),
                               serve(text=texts)["probabilities"].numpy(), atol=1e-6)


def test_the_fresh_load_check_stops_its_interpreter_when_the_export_fails():
    with pytest.raises(RuntimeError), export.FreshLoadCheck() as fresh:
        raise RuntimeError("the export failed before the check")
    assert fresh._proc.returncode is not None  # killed, not left waiting on stdin


def test_serving_strips_the_ends_python_strips():
    """The data step reads texts with str.strip(); serving's in-graph strip_ends matches it
    on every code point of the Basic Multilingual Plane and a few beyond."""
    import tensorflow as tf

    from tasks.steps.export import strip_ends

    points = [c for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF] + [0x1F600, 0x10FFFD]
    texts = [f"{chr(c)}{chr(c)}a {chr(c)} b{chr(c)}" for c in points]
    got = [t.decode() for t in strip_ends(tf.constant(texts)).numpy()]
    wrong = [hex(c) for c, text, out in zip(points, texts, got) if out != text.strip()]
    assert not wrong, wrong[:10]
    assert sum(chr(c).isspace() for c in points) > 20  # the check saw whitespace to strip
