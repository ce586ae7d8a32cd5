"""Named entities through the whole DAG (dag.test()): task token_classification on a small
CoNLL training file and a JSON Lines evaluation file, with a tiny random BERT over the real
uncased vocabulary, and a tiny RoBERTa (byte-level BPE: a word's first piece carries its
space; tests/family_checkpoints.py). Every task succeeds; evaluate scores entities per type; the exported
SavedModel takes raw strings and returns entities whose offsets index the input; the version
folder's Hugging Face checkpoint gives the same entities in transformers'
pipeline("ner", aggregation_strategy="first") (PyTorch); the model card tables each type."""
from __future__ import annotations

import json
import shutil

import pytest

from bertflow_airflow.demo import run_dag, run_folder
from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.training.checkpoint_sources import default_base_model_dir
from family_checkpoints import tiny_roberta
from train_helpers import tagged_sentences, write_tiny_model

PEOPLE = ["alice", "bob", "carol", "dave", "erin"]
PLACES = [["paris"], ["london"], ["new", "york"], ["san", "francisco"]]
FILLER = ["today", "we", "met", "went", "to", "and", "the", "in", "saw", "from"]
# Plain words and spaces only: the pipeline's pre-tokenizer would also split punctuation
# (tasks/training/entity_decoding.py says why the words differ there).
TEXTS = ["alice went to new york today", "we saw bob and carol in paris",
         "the weather was fine"]


def sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    return tagged_sentences(n, seed, PEOPLE, PLACES, FILLER, most=8)


WORDS = PEOPLE + [w for place in PLACES for w in place] + FILLER
ARCHITECTURES = {"bert": "BertForTokenClassification",
                 "roberta": "RobertaForTokenClassification"}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def finished_run(request, airflow_db, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ner") / "checkpoint"
    if request.param == "roberta":
        # Its BPE learns the words with their space: no first piece is a lone "Ġ", which
        # the pipeline would take for a word (docs/model.md).
        folder.mkdir()
        tiny_roberta(folder, extra=(" " + " ".join(WORDS),) * 4, vocab_size=700)
    else:
        vocab = default_base_model_dir() / "vocab.txt"
        write_tiny_model(folder, vocab_size=len(vocab.read_text().splitlines()),
                         max_position_embeddings=64)
        shutil.copy(vocab, folder / "vocab.txt")
    data = folder.parent
    with open(data / "train.conll", "w") as f:
        f.write("-DOCSTART- O\n\n")
        for words, tags in sentences(160, seed=1):
            f.write("".join(f"{w}\t{t}\n" for w, t in zip(words, tags)) + "\n")
    with open(data / "dev.jsonl", "w") as f:
        for words, tags in sentences(40, seed=2):
            f.write(json.dumps({"tokens": words, "tags": tags}) + "\n")
    root = str(tmp_path_factory.mktemp("artifacts"))
    dag_run = run_dag({"task": "token_classification", "train_uri": str(data / "train.conll"),
                       "eval_uri": str(data / "dev.jsonl"), "max_seq_length": 32,
                       "epochs": 3, "per_replica_batch_size": 16, "learning_rate": 3e-3,
                       "num_shards": 1, "num_workers": 1, "eval_batch_size": 64,
                       "artifact_root": root, "base_model": str(folder),
                       "model_name": "tiny-ner"})
    return dag_run, run_folder(dag_run, root), request.param


def test_every_task_succeeds_and_entities_are_scored_per_type(finished_run):
    dag_run, run_uri, _ = finished_run
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert {task: state for task, state in states.items() if state != "success"} == {
        "approval": "skipped"}, states
    data = storage.read_json(join_uri(run_uri, "data", "manifest.json"))
    assert data["labels"] == ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    assert (data["splits"]["train"]["num_examples"], data["splits"]["eval"]["num_examples"]) \
        == (160, 40)
    evaluation = storage.read_json(join_uri(run_uri, "evaluate", "manifest.json"))
    metrics = storage.read_json(evaluation["metrics_uri"])
    assert set(evaluation["metrics"]) == {"f1", "macro_f1", "precision", "recall"}
    assert set(metrics["per_type"]) == {"LOC", "PER"}
    # Every true entity of the 40 sentences is counted once.
    expected = sum(tag.startswith("B-") for _, tags in sentences(40, seed=2) for tag in tags)
    assert sum(m["support"] for m in metrics["per_type"].values()) == expected
    assert metrics["f1"] > 0.5, metrics  # names and places are easy to tell from filler
    gate = storage.read_json(join_uri(run_uri, "gate", "manifest.json"))
    assert (gate["metric"], gate["value"]) == ("f1", metrics["f1"])


def _served(version: str) -> list[list[dict]]:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's tokenizer ops)

    serve = tf.saved_model.load(join_uri(version, "saved_model")).signatures["serving_default"]
    out = {k: v.numpy() for k, v in serve(text=tf.constant(TEXTS)).items()}
    return [[{"entity_group": out["entity_group"][i, j].decode(),
              "word": out["word"][i, j].decode(), "start": int(out["start"][i, j]),
              "end": int(out["end"][i, j]), "score": float(out["score"][i, j])}
             for j in range(out["num_entities"][i])] for i in range(len(TEXTS))]


def test_saved_model_returns_entities_as_the_pipeline_does(finished_run):
    import torch_env

    _, run_uri, family = finished_run
    version = storage.read_json(join_uri(run_uri, "export", "manifest.json"))["version_uri"]
    served = _served(version)
    for text, entities in zip(TEXTS, served):
        for entity in entities:
            assert text[entity["start"]:entity["end"]] == entity["word"]
    assert any(served), served  # the trained model finds some entity
    try:
        torch_env.python()
    except torch_env.Unavailable as err:
        pytest.skip(str(err))
    config = storage.read_json(join_uri(version, "config.json"))
    assert config["architectures"] == [ARCHITECTURES[family]]
    theirs = torch_env.ner(version, TEXTS)
    for ours, pipeline in zip(served, theirs):
        # RoBERTa's pipeline words keep the first piece's space (" paris"): stripped.
        assert [(e["entity_group"], e["start"], e["end"], e["word"]) for e in ours] == \
            [(e["entity_group"], e["start"], e["end"], e["word"].strip()) for e in pipeline]
        assert [e["score"] for e in ours] == pytest.approx([e["score"] for e in pipeline],
                                                           abs=1e-4)


def test_model_card_tables_each_entity_type(finished_run):
    _, run_uri, _ = finished_run
    version = storage.read_json(join_uri(run_uri, "export", "manifest.json"))["version_uri"]
    card = storage.read_text(join_uri(version, "model_card.md"))
    assert "| entity type | precision | recall | f1 | support |" in card
    assert "| LOC |" in card and "| PER |" in card
    assert "AutoModelForTokenClassification" in card
