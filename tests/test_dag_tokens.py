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
ARCHITECTURES = {"bert": "BertForTokenClassification", "bert-cased": "BertForTokenClassification",
                 "roberta": "RobertaForTokenClassification",
                 "xlm-roberta": "XLMRobertaForTokenClassification",
                 "deberta-v2": "DebertaV2ForTokenClassification"}
# The cased BERT, XLM-R and DeBERTa-v3 take train_helpers' words (capitals, accents, CJK,
# punctuation), which their tiny vocabularies learn, and its SERVED texts, whose words start
# with neither a lone "▁" nor an unknown piece (the pipeline would split them otherwise).
# Their pieces are more and smaller: no sentence is cut at 64 pieces, and they need more
# steps to learn the words.
MIXED = {"bert-cased", "xlm-roberta", "deberta-v2"}
SHAPE = {False: {"max_seq_length": 32, "epochs": 3, "learning_rate": 3e-3},
         True: {"max_seq_length": 64, "epochs": 10, "learning_rate": 1e-2}}
# Names and places are easy to tell from filler; the mixed words' tiny vocabularies learn
# slower, so for them the bar is the steps tests' (an untrained model scores 0).
LEAST_F1 = {False: 0.5, True: 0.25}
# A cased BERT's pre-tokenizer splits punctuation off a word (SERVED's "fox's" is three words
# to the pipeline, one to bertflow): its texts have none.
CASED_TEXTS = SERVED[:2] + ["Pablo saw the café"]


def sentences(family: str, n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    if family in MIXED:
        return tagged_sentences(n, seed, most=8)
    return tagged_sentences(n, seed, PEOPLE, PLACES, FILLER, most=8)


def texts(family: str) -> list[str]:
    if family == "bert-cased":
        return CASED_TEXTS
    return SERVED if family in MIXED else TEXTS


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def finished_run(request, airflow_db, tmp_path_factory):
    family = request.param
    folder = tmp_path_factory.mktemp("ner") / "checkpoint"
    if family in MIXED:
        folder.mkdir()
        BUILDERS[family](folder)
    elif family == "roberta":
        # Its BPE learns the words with their space: no first piece is a lone "Ġ", which
        # the pipeline would take for a word (docs/model.md).
        folder.mkdir()
        tiny_roberta(folder, extra=(" " + " ".join(WORDS),) * 4, vocab_size=700)
    else:
        tiny_default_vocab(folder)
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
                       "eval_uri": str(data / "dev.jsonl"), **SHAPE[family in MIXED],
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
    assert metrics["f1"] > LEAST_F1[family in MIXED], metrics
    gate = storage.read_json(join_uri(run_uri, "gate", "manifest.json"))
    assert (gate["metric"], gate["value"]) == ("f1", metrics["f1"])


def test_saved_model_returns_entities_as_the_pipeline_does(finished_run):
    _, run_uri, family = finished_run
    version = storage.read_json(join_uri(run_uri, "export", "manifest.json"))["version_uri"]
    entities_as_the_pipeline(Path(version), ARCHITECTURES[family], texts(family))


def test_model_card_tables_each_entity_type(finished_run):
    _, run_uri, _ = finished_run
    version = storage.read_json(join_uri(run_uri, "export", "manifest.json"))["version_uri"]
    card = storage.read_text(join_uri(version, "model_card.md"))
    assert "| entity type | precision | recall | f1 | support |" in card
    assert "| LOC |" in card and "| PER |" in card
    assert "AutoModelForTokenClassification" in card
