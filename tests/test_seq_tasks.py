"""Multi-label and regression runs (issue 33): the `task` Param, the data errors that name
the file, line and fix before any compute, and the whole pipeline (init-run, then data,
tokenize, train, evaluate, export) on tiny files with a tiny random model, down to the
exported SavedModel's outputs."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.config import parse_config
from tasks.errors import ConfigError, DataError
from tasks.runs.runlayout import RunContext, read_manifest
from tasks.steps import data
from train_helpers import VOCAB, run_steps_in_subprocess, write_tiny_model

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOWER, UPPER = VOCAB[5:52], VOCAB[52:]  # the tiny vocabulary's two halves of words


def _run_data(tmp_path, name: str, content: str, **overrides) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / name
    path.write_text(content)
    cfg = parse_config({"train_uri": str(path), "artifact_root": str(tmp_path / "art"),
                        **overrides})
    return read_manifest(data.run(cfg, RunContext(str(tmp_path / "art"), "dag", "run1")))


def _data_error(tmp_path, name, content, **overrides) -> DataError:
    with pytest.raises(DataError) as err:
        _run_data(tmp_path, name, content, **overrides)
    return err.value


# --- config -----------------------------------------------------------------------------
def test_task_params_and_their_checks():
    assert parse_config({}).task == "classification"
    assert parse_config({"task": "multi_label"}).gate_metric_name == "micro_f1"
    assert parse_config({"task": "regression"}).gate_metric_name == "pearson"
    assert parse_config({"task": "token_classification"}).gate_metric_name == "f1"
    with pytest.raises(ConfigError, match="leave text_pair_column empty"):
        parse_config({"task": "token_classification", "text_pair_column": "b"})
    with pytest.raises(ConfigError, match="set task to token_classification"):
        parse_config({"file_format": "conll"})
    with pytest.raises(ConfigError, match="accuracy is not a regression metric"):
        parse_config({"task": "regression", "gate_metric": "accuracy"})
    with pytest.raises(ConfigError, match="multi_label_threshold"):
        parse_config({"multi_label_threshold": 1.0})


# --- data errors -------------------------------------------------------------------------
def test_a_non_numeric_regression_value_names_file_line_and_fix(tmp_path):
    err = _data_error(tmp_path, "scores.tsv", "text\tlabel\na\t0.5\nb\tpos\n", task="regression")
    assert err.line == 3 and "scores.tsv" in str(err)
    assert "regression needs a number" in str(err) and "'pos'" in str(err)
    assert "set task to classification" in str(err)


@pytest.mark.parametrize("name, content", [
    ("tags.tsv", "text\tlabel\na\tx,y\nb\t , \n"),
    ("tags.jsonl", '{"text": "a", "label": ["x"]}\n{"text": "b", "label": []}\n')])
def test_a_multi_label_row_without_a_label(tmp_path, name, content):
    err = _data_error(tmp_path, name, content, task="multi_label")
    assert err.line == (3 if name.endswith("tsv") else 2)
    assert "no label in this multi-label row" in str(err) and "give at least one" in str(err)


def test_joined_labels_in_a_classification_file_hint_multi_label(tmp_path):
    rows = "".join(f"t{i}\t{'a,b' if i % 3 else 'a'}\n" for i in range(9))
    err = _data_error(tmp_path, "joined.tsv", "text\tlabel\n" + rows)
    assert "label delimiter ','" in str(err) and "set task to multi_label" in str(err)
    assert err.line == 3  # the first row with a comma (t1)


def test_scores_in_a_classification_file_hint_regression(tmp_path):
    rows = "".join(f"t{i}\t{i / 7:.3f}\n" for i in range(12))
    err = _data_error(tmp_path, "scores.tsv", "text\tlabel\n" + rows)
    assert "numeric labels" in str(err) and "set task to regression" in str(err)


def test_a_json_list_in_a_classification_file_hints_multi_label(tmp_path):
    err = _data_error(tmp_path, "l.jsonl", '{"text": "a", "label": ["x", "y"]}\n')
    assert err.line == 1 and "set task to multi_label" in str(err)


def test_multi_label_names_outside_the_allowed_labels(tmp_path):
    err = _data_error(tmp_path, "tags.tsv", "text\tlabel\na\tx,y\nb\tx,z\n", task="multi_label",
                      labels=["x", "y"])
    assert err.line == 3 and "'z' is not one of the allowed labels" in str(err)


def test_multi_label_and_regression_manifests(tmp_path):
    rows = "".join(f"t{i}\t{['x', 'x;y', 'y;z'][i % 3]}\n" for i in range(30))
    multi = _run_data(tmp_path / "m", "tags.tsv", "text\tlabel\n" + rows,
                      task="multi_label", label_delimiter=";")
    assert multi["task"] == "multi_label" and multi["labels"] == ["x", "y", "z"]
    counts = {k: multi["splits"]["train"]["label_counts"][k] + multi["splits"]["eval"][
        "label_counts"][k] for k in "xyz"}
    assert counts == {"x": 20, "y": 20, "z": 10}
    assert multi["splits"]["eval"]["num_examples"] == 3  # one per first label (x, x, y)
    first = Path(multi["splits"]["eval"]["shards"][0]).read_text().splitlines()[0]
    assert isinstance(json.loads(first)["label"], list)
    scores = "".join(f"t{i}\t{i / 10}\n" for i in range(30))
    reg = _run_data(tmp_path / "r", "scores.csv", "text,score\n" + scores.replace("\t", ","),
                    task="regression", label_column="score")
    assert reg["task"] == "regression" and reg["labels"] == ["score"]
    assert reg["splits"]["eval"]["num_examples"] == 3  # round(30 * 0.1), plain seeded
    assert reg["splits"]["train"]["label_counts"] == {}
    assert "plain seeded" in reg["split_rule"]["rule"]


# --- end to end --------------------------------------------------------------------------
def _tiny_file(path: Path, task: str, n: int = 96) -> None:
    """Texts of words from the two halves of the tiny vocabulary in a per-row share; the
    labels say which halves a text uses (multi-label) or the share itself (regression)."""
    rng = random.Random(7)
    rows = []
    for i in range(n):
        # multi-label: all lower, half and half, all upper; regression: quarters too
        share = (i % 3) / 2 if task == "multi_label" else (i % 5) / 4
        words = [rng.choice(UPPER if rng.random() < share else LOWER)
                 for _ in range(rng.randint(4, 12))]
        upper = sum(w in UPPER for w in words)
        if task == "multi_label":
            label = ["lower"] * (upper < len(words)) + ["upper"] * (upper > 0)
            rows.append({"text": " ".join(words), "label": label})
        else:
            rows.append({"text": " ".join(words), "label": round(upper / len(words), 4)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("task", ["multi_label", "regression"])
def test_whole_pipeline_from_the_cli(tmp_path, task):
    """init-run --task, then data, tokenize, train, evaluate and export in one fresh process:
    manifests, metrics and the SavedModel's outputs."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    model_dir = write_tiny_model(tmp_path / "base")
    train_file = tmp_path / "train.jsonl"
    _tiny_file(train_file, task)
    run_dir = tmp_path / "run"
    init = subprocess.run(
        [sys.executable, "-m", "tasks", "init-run", "--run-dir", str(run_dir), "--task", task,
         "--train-uri", str(train_file), "--base-model", str(model_dir),
         "--artifact-root", str(tmp_path / "art"), "--max-seq-length", "16",
         "--epochs", "10", "--learning-rate", "0.01", "--per-replica-batch-size", "16",
         "--mixed-precision", "none", "--eval-fraction", "0.25", "--num-shards", "2"],
        capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert init.returncode == 0, init.stderr
    done = run_steps_in_subprocess(str(run_dir), "data", "tokenize", "train", "evaluate",
                                   "export", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    manifests = {step: json.loads((run_dir / step / "manifest.json").read_text())
                 for step in ("data", "tokenize", "train", "evaluate", "export")}
    assert {m.get("task") for m in manifests.values()} == {task}
    tok = manifests["tokenize"]
    metrics = json.loads(Path(manifests["evaluate"]["metrics_uri"]).read_text())
    held_out = manifests["data"]["splits"]["eval"]["num_examples"]
    assert metrics["num_examples"] == tok["splits"]["eval"]["num_examples"] == held_out
    assert 22 <= held_out <= 26  # eval_fraction 0.25 of 96 rows, per stratum
    print(task, manifests["evaluate"]["metrics"])
    serve = tf.saved_model.load(
        f"{manifests['export']['version_uri']}/saved_model").signatures["serving_default"]
    out = serve(text=tf.constant([" ".join(LOWER[:6]), " ".join(UPPER[:6])]))
    if task == "multi_label":
        assert tok["label_spec"] == {"dtype": "float32", "shape": [2]}
        assert manifests["data"]["labels"] == ["lower", "upper"]
        assert metrics["micro_f1"] > 0.8, metrics
        assert set(metrics["per_label"]) == {"lower", "upper"}
        probabilities = out["probabilities"].numpy()
        # The all-lower text is more "lower" than "upper", the all-upper one the reverse.
        assert probabilities[0, 0] > probabilities[0, 1] and \
            probabilities[1, 1] > probabilities[1, 0], probabilities
        labels = out["labels"].numpy().astype(str).tolist()
        assert labels == [[name for name, p in zip(["lower", "upper"], row) if p > 0.5]
                          + [""] * sum(p <= 0.5 for p in row) for row in probabilities]
        print("served", labels, probabilities)
    else:
        assert tok["label_spec"] == {"dtype": "float32", "shape": [1]}
        assert metrics["pearson"] > 0.8 and metrics["spearman"] > 0.8, metrics
        score = out["score"].numpy()
        print("served", score)
        assert score.shape == (2,) and score[0] < score[1] - 0.2, score


def test_validate_reads_the_first_labels_as_the_task_does(tmp_path):
    """check_inputs (the validate task) refuses a file written for another task before any
    worker starts."""
    path = tmp_path / "scores.tsv"
    path.write_text("text\tlabel\na\tpos\nb\tneg\n")
    with pytest.raises(DataError, match="regression needs a number") as err:
        data.check_inputs(parse_config({"train_uri": str(path), "task": "regression"}))
    assert err.value.line == 2
    data.check_inputs(parse_config({"train_uri": str(path)}))
