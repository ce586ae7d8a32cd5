"""Named entities through the whole DAG (dag.test()): task token_classification on a small
CoNLL training file and a JSON Lines evaluation file, for a tiny random checkpoint of each
family: a BERT over the real uncased vocabulary, and, over the vocabularies their steps tests
train (tests/family_checkpoints.py), a cased BERT, a RoBERTa (byte-level BPE: a word's first
piece carries its space), an XLM-R and a DeBERTa-v3 (SentencePiece). Every task succeeds;
evaluate scores entities per type; the exported SavedModel takes raw strings and returns
entities whose offsets index the input; the version folder's Hugging Face checkpoint gives the
same entities in transformers' pipeline("ner", aggregation_strategy="first") (PyTorch); the
model card tables each type."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

from bertflow_airflow.demo import run_dag, run_folder
from tasks.io import storage
from tasks.io.uris import join_uri
from family_checkpoints import BUILDERS, tiny_default_vocab, tiny_roberta
from train_helpers import SERVED, entities_as_the_pipeline, tagged_sentences

PEOPLE = ["alice", "bob", "carol", "dave", "erin"]
PLACES = [["paris"], ["london"], ["new", "york"], ["san", "francisco"]]
FILLER = ["today", "we", "met", "went", "to", "and", "the", "in", "saw", "from"]
# Plain words and spaces only: the pipeline's pre-tokenizer would also split punctuation
# (tasks/training/entity_decoding.py says why the words differ there).
TEXTS = ["alice went to new york today", "we saw bob and carol in paris",
         "the weather was fine"]
WORDS = PEOPLE + [w for place in PLACES for w in place] + FILLER


def words_roberta(folder: Path) -> Path:
    """Its BPE learns the words with their space: no first piece is a lone "Ġ", which the
    pipeline would take for a word (docs/model.md)."""
    return tiny_roberta(folder, extra=(" " + " ".join(WORDS),) * 4, vocab_size=700)


class Family(NamedTuple):
    architecture: str
    build: Callable[[Path], object]  # writes the tiny checkpoint into an empty folder
    words: dict  # tagged_sentences' names, places and filler ({}: train_helpers')
    texts: list[str]  # served to the SavedModel and the pipeline
    shape: dict  # the run's max_seq_length, epochs and learning_rate
    least_f1: float  # evaluate's f1 must be above it


# The uncased BERT and the RoBERTa take the lower-case words above. Names and places are easy
# to tell from filler: 3 epochs reach f1 0.5.
OWN_WORDS = {"names": PEOPLE, "places": PLACES, "filler": FILLER}
SHORT = {"max_seq_length": 32, "epochs": 3, "learning_rate": 3e-3}
# The cased BERT, XLM-R and DeBERTa-v3 take train_helpers' words (capitals, accents, CJK,
# punctuation), which their tiny vocabularies learn, and its SERVED texts, whose words are
# the pipeline's too (train_helpers says why).
# Their pieces are more and smaller: no sentence is cut at 64 pieces, and they need more
# steps to learn the words; the bar is the steps tests' (an untrained model scores 0).
MIXED = {"max_seq_length": 64, "epochs": 10, "learning_rate": 1e-2}
FAMILIES = {
    "bert": Family("BertForTokenClassification", tiny_default_vocab, OWN_WORDS, TEXTS, SHORT,
                   0.5),
    "roberta": Family("RobertaForTokenClassification", words_roberta, OWN_WORDS, TEXTS, SHORT,
                      0.5),
    "bert-cased": Family("BertForTokenClassification", BUILDERS["bert-cased"], {}, SERVED, MIXED,
                         0.25),
    "xlm-roberta": Family("XLMRobertaForTokenClassification", BUILDERS["xlm-roberta"], {},
                          SERVED, MIXED, 0.25),
    "deberta-v2": Family("DebertaV2ForTokenClassification", BUILDERS["deberta-v2"], {},
                         SERVED, MIXED, 0.25),
}


def sentences(family: str, n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    return tagged_sentences(n, seed, **FAMILIES[family].words, most=8)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def finished_run(request, airflow_db, tmp_path_factory):
    family = request.param
    folder = tmp_path_factory.mktemp("ner") / "checkpoint"
    folder.mkdir()
    FAMILIES[family].build(folder)
    data = folder.parent
    with open(data / "train.conll", "w") as f:
        f.write("-DOCSTART- O\n\n")
        for words, tags in sentences(family, 160, seed=1):
            f.write("".join(f"{w}\t{t}\n" for w, t in zip(words, tags)) + "\n")
    with open(data / "dev.jsonl", "w") as f:
        for words, tags in sentences(family, 40, seed=2):
            f.write(json.dumps({"tokens": words, "tags": tags}) + "\n")
    root = str(tmp_path_factory.mktemp("artifacts"))
    dag_run = run_dag({"task": "token_classification", "train_uri": str(data / "train.conll"),
                       "eval_uri": str(data / "dev.jsonl"), **FAMILIES[family].shape,
                       "per_replica_batch_size": 16,
                       "num_shards": 1, "num_workers": 1, "eval_batch_size": 64,
                       "artifact_root": root, "base_model": str(folder),
                       "model_name": "tiny-ner"})
    return dag_run, run_folder(dag_run, root), family


def test_every_task_succeeds_and_entities_are_scored_per_type(finished_run):
    dag_run, run_uri, family = finished_run
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
    # Every true entity of the 40 sentences is counted once (none is cut off).
    assert metrics["truncated_sentences"] == 0
    expected = sum(tag.startswith("B-") for _, tags in sentences(family, 40, seed=2)
                   for tag in tags)
    assert sum(m["support"] for m in metrics["per_type"].values()) == expected
    assert metrics["f1"] > FAMILIES[family].least_f1, metrics
    gate = storage.read_json(join_uri(run_uri, "gate", "manifest.json"))
    assert (gate["metric"], gate["value"]) == ("f1", metrics["f1"])


def test_saved_model_returns_entities_as_the_pipeline_does(finished_run):
    _, run_uri, family = finished_run
    version = storage.read_json(join_uri(run_uri, "export", "manifest.json"))["version_uri"]
    entities_as_the_pipeline(Path(version), FAMILIES[family].architecture,
                             FAMILIES[family].texts)


def test_model_card_tables_each_entity_type(finished_run):
    _, run_uri, _ = finished_run
    version = storage.read_json(join_uri(run_uri, "export", "manifest.json"))["version_uri"]
    card = storage.read_text(join_uri(version, "model_card.md"))
    assert "| entity type | precision | recall | f1 | support |" in card
    assert "| LOC |" in card and "| PER |" in card
    assert "AutoModelForTokenClassification" in card
