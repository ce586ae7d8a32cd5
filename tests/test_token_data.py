"""The data and tokenize steps for token classification (tasks/steps/token_data.py, the
token codec of tasks/steps/tokenize.py): sentences of a CoNLL or JSON Lines file become
prepared shards split by sentence, then TFRecords with a tag id on each word's first piece;
bad input is refused naming the file and line, before any output. The real uncased
vocabulary of the default checkpoint; WNUT17 (../shared/data) where present."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tasks.config import parse_config
from tasks.errors import DataError
from tasks.io import storage
from tasks.io.tfrecord_io import example_records
from tasks.runs.runlayout import RunContext
from tasks.steps import data, tokenize, validate

WNUT17 = Path(__file__).resolve().parents[2] / "shared" / "data" / "wnut17"
CONLL = """-DOCSTART- O

Alice\tB-PER
visited\tO
New\tB-LOC
York\tI-LOC

Bob\tB-PER
stayed\tO
home\tO
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run_data(tmp_path: Path, **overrides) -> dict:
    cfg = parse_config({"task": "token_classification", "artifact_root": str(tmp_path / "a"),
                        "num_shards": 2, **overrides})
    ctx = RunContext(cfg.artifact_root, "dag", "run1")
    return cfg, ctx, storage.read_json(data.run(cfg, ctx))


def test_conll_train_and_jsonl_eval_become_prepared_sentences(tmp_path):
    evals = write(tmp_path, "dev.jsonl", json.dumps(
        {"tokens": ["Carol", "in", "York"], "tags": ["B-PER", "O", "B-LOC"]}) + "\n")
    _, _, manifest = run_data(tmp_path, train_uri=write(tmp_path, "train.conll", CONLL),
                              eval_uri=evals)
    assert manifest["labels"] == ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    assert manifest["task"] == "token_classification" and manifest["eval_source"] == "file"
    assert manifest["splits"]["train"]["num_examples"] == 2
    rows = [json.loads(line) for shard in manifest["splits"]["train"]["shards"]
            for line in storage.read_text(shard).splitlines()]
    assert rows[0] == {"words": ["Alice", "visited", "New", "York"], "tags": [2, 0, 1, 3]}
    assert manifest["splits"]["train"]["label_counts"] == {
        "O": 3, "B-LOC": 1, "B-PER": 2, "I-LOC": 1, "I-PER": 0}


def test_a_train_file_alone_is_split_by_sentence(tmp_path):
    text = "".join(f"w{i}\tB-X\nrest\tO\n\n" for i in range(40))
    _, _, manifest = run_data(tmp_path, train_uri=write(tmp_path, "t.conll", text),
                              eval_fraction=0.1)
    assert (manifest["splits"]["train"]["num_examples"],
            manifest["splits"]["eval"]["num_examples"]) == (36, 4)
    assert manifest["split_rule"]["rule"].startswith("by sentence")
    # With validation, the test sentences stay; validation comes from the 36 left.
    test_rows = storage.read_text(manifest["splits"]["eval"]["shards"][0])
    _, _, three = run_data(tmp_path, train_uri=str(tmp_path / "t.conll"), eval_fraction=0.1,
                           validation_fraction=0.25)
    assert [three["splits"][s]["num_examples"] for s in ("train", "validation", "eval")] == [
        27, 9, 4]
    assert storage.read_text(three["splits"]["eval"]["shards"][0]) == test_rows


@pytest.mark.parametrize("name,text,overrides,line,reason", [
    ("t.conll", "Alice\n", {}, 1, "expected a token and its tag"),
    ("t.conll", "Alice\tB-PER\nx\tU-LOC\n", {}, 2, "not in the BIO scheme"),
    ("t.conll", "a\tO\nb\tO\n", {}, 1, "no entity tags"),
    ("t.conll", "\n\n", {}, None, "empty"),
    ("t.tsv", "text\tlabel\nhello\tx\n", {}, None, "not TSV"),
    ("t.conll", CONLL, {"labels": ["B-PER", "I-PER"]}, 3, "not one of the allowed labels"),
])
def test_bad_input_is_refused_naming_file_and_line(tmp_path, name, text, overrides, line,
                                                    reason):
    uri = write(tmp_path, name, text)
    with pytest.raises(DataError, match=reason) as err:
        run_data(tmp_path, train_uri=uri, **overrides)
    assert err.value.path == uri and err.value.line == line
    assert not (tmp_path / "a").exists()  # nothing written


def test_an_eval_tag_unseen_in_training_is_refused(tmp_path):
    evals = write(tmp_path, "dev.conll", "Acme\tB-ORG\n")
    with pytest.raises(DataError, match="'B-ORG' .* never appears in the training data") as err:
        run_data(tmp_path, train_uri=write(tmp_path, "train.conll", CONLL), eval_uri=evals)
    assert (err.value.path, err.value.line) == (evals, 1)


def test_validate_names_the_task_a_file_is_for(tmp_path):
    conll = write(tmp_path, "train.conll", CONLL)
    with pytest.raises(DataError, match="set task to token_classification"):
        validate.check_inputs_and_model(parse_config({"train_uri": conll}))
    tsv = write(tmp_path, "t.tsv", "text\tlabel\nhello\tx\n")
    with pytest.raises(DataError, match="set task to classification"):
        validate.check_inputs_and_model(parse_config({"train_uri": tsv,
                                                      "task": "token_classification"}))


def test_tokenize_labels_the_first_piece_of_each_word(tmp_path):
    cfg, ctx, _ = run_data(tmp_path, train_uri=write(tmp_path, "train.conll", CONLL),
                           eval_uri=write(tmp_path, "dev.conll", "Newyorkers\tB-PER\n"))
    manifest = storage.read_json(tokenize.run(cfg, ctx))
    assert manifest["label_spec"] == {"dtype": "int64", "shape": [None], "per_token": True}
    records = [tf.train.Example.FromString(r.numpy())
               for r in tf.data.TFRecordDataset(manifest["splits"]["eval"]["shards"])]
    feature = records[0].features.feature
    ids = list(feature["input_ids"].int64_list.value)
    labels = list(feature["label"].int64_list.value)
    assert len(ids) == len(labels) > 3  # "newyorkers" is several word pieces
    assert labels == [-100, 2] + [-100] * (len(ids) - 2)  # B-PER on its first piece only


def test_per_piece_label_records_parse_as_the_protobufs():
    ids = np.array([101, 7, 8, 102, 101, 9, 102], np.int64)
    lengths = np.array([4, 3])
    labels = (np.array([-100, 1, -100, -100, -100, 0, -100], np.int64), lengths)
    bare, starts = example_records(ids, lengths, np.zeros_like(ids), labels, framed=False)
    for i, (a, b) in enumerate(zip(starts[:-1], starts[1:])):
        rows = slice(sum(lengths[:i]), sum(lengths[:i + 1]))
        want = tf.train.Example(features=tf.train.Features(feature={
            name: tf.train.Feature(int64_list=tf.train.Int64List(value=values[rows]))
            for name, values in (("input_ids", ids), ("token_type_ids", np.zeros_like(ids)),
                                 ("label", labels[0]))}))
        assert tf.train.Example.FromString(bare[a:b].tobytes()) == want


@pytest.mark.skipif(not WNUT17.is_dir(), reason=f"{WNUT17} absent (shared test data)")
def test_wnut17_data_and_tokenize(tmp_path):
    cfg, ctx, manifest = run_data(tmp_path, train_uri=str(WNUT17 / "train.conll"),
                                  eval_uri=str(WNUT17 / "dev.conll"))
    assert len(manifest["labels"]) == 13
    assert (manifest["splits"]["train"]["num_examples"],
            manifest["splits"]["eval"]["num_examples"]) == (3394, 1009)
    tokens = storage.read_json(tokenize.run(cfg, ctx))
    assert tokens["splits"]["eval"]["num_examples"] == 1009
    assert tokens["splits"]["train"]["num_truncated"] == 0  # max_seq_length 128 holds all
