"""A RoBERTa checkpoint through the steps: validate's checks, data, tokenize (byte-level BPE in
the TFRecords, equal to RobertaTokenizerFast), train and evaluate (a subprocess, as the CLI
runs them), export (a SavedModel that serves in a fresh interpreter, which the export step
checks, and a Hugging Face folder whose tokenizer loads in transformers); for token
classification, the TFRecords (tests/test_dag_tokens.py trains, exports and serves this
family's entities through the whole DAG, against transformers' pipeline).

The checkpoint is tiny and random, written by bertflow's own save (tasks/model/hf_weights.py,
whose RoBERTa keys tests/test_model_parity.py checks against PyTorch's) beside a byte-level
BPE trained here (tests/test_byte_bpe.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.errors import BertflowError
from tasks.training import checkpoint
from family_checkpoints import tiny_roberta
from test_byte_bpe import CORPUS
from train_helpers import (FILLER, NAMES, PLACES, aligned_as_transformers, steps_of_a_family,
                           token_records_of_a_family)

transformers = pytest.importorskip("transformers")

TEXTS = [t for t in CORPUS if t.strip()] * 4
# The words of the token tests' sentences. Trained on only CORPUS, the tiny BPE starts most of
# them with a lone "Ġ" piece (the space, its word's first piece). bertflow labels a word by its
# first piece, as transformers' word_ids() does; transformers' ner pipeline has no
# continuing-subword prefix to find byte-level BPE words by and falls back to a heuristic
# that takes a lone "Ġ" for a word of its own. A real RoBERTa vocabulary merges the space
# into nearly every word (docs/model.md); here the BPE learns these words so that the
# pipeline's words are the whitespace split, as in train_helpers.SERVED.
WORDS = NAMES + [w for place in PLACES for w in place] + FILLER


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory) -> Path:
    # The tagged sentences' words merged with their leading space (see WORDS).
    folder = tiny_roberta(tmp_path_factory.mktemp("tiny-roberta"),
                          extra=(" " + " ".join(WORDS),) * 4, vocab_size=900)
    hf = transformers.RobertaTokenizerFast.from_pretrained(str(folder), add_prefix_space=True)
    assert not [w for w in WORDS if hf.tokenize(w)[0] == "\u0120"]  # no lone "Ġ"
    return folder


def test_a_roberta_folder_needs_its_merges(roberta_dir, tmp_path):
    checkpoint.check_model_dir(roberta_dir)
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in roberta_dir.iterdir():
        if path.name != "merges.txt":
            (broken / path.name).write_bytes(path.read_bytes())
    with pytest.raises(BertflowError, match=r"missing merges.txt \(a roberta checkpoint's "
                                            r"tokenizer is vocab.json and merges.txt\)"):
        checkpoint.check_model_dir(broken)
    with pytest.raises(BertflowError, match="byte-level BPE does not lower-case"):
        checkpoint.text_encoder(roberta_dir, True, 32)


def test_tokenize_train_evaluate_export(roberta_dir, tmp_path):
    import tensorflow as tf

    reference = transformers.RobertaTokenizerFast.from_pretrained(str(roberta_dir))
    manifest, folder, prepared = steps_of_a_family(roberta_dir, tmp_path, TEXTS, reference)
    assert manifest["lower_case"] is False
    assert manifest["lower_case_rule"] == "roberta: byte-level BPE reads text as it is"
    exported = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert type(exported).__name__.startswith("RobertaTokenizer")
    assert exported(prepared[:5])["input_ids"] == reference(prepared[:5])["input_ids"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["RobertaForSequenceClassification"]
    # Serving strips a text's ends as the data step did: byte-level BPE would give " x" and
    # "x" different pieces.
    serve = tf.saved_model.load(str(folder / "saved_model")).signatures["serving_default"]
    texts = prepared[:4]
    padded = [f" \u3000{t}\n\t" for t in texts]
    assert (serve(text=tf.constant(padded))["probabilities"].numpy().tolist()
            == serve(text=tf.constant(texts))["probabilities"].numpy().tolist())


def test_token_pieces_and_labels_equal_is_split_into_words(roberta_dir):
    aligned_as_transformers(roberta_dir, transformers.RobertaTokenizerFast.from_pretrained(
        str(roberta_dir), add_prefix_space=True))


def test_token_classification_records_are_transformers(roberta_dir, tmp_path):
    """The TFRecords hold transformers' is_split_into_words ids and first-piece labels, cut
    where it cuts them. Training, evaluation, the export and the pipeline's entities for this
    family: tests/test_dag_tokens.py[roberta], through the whole DAG."""
    reference = transformers.RobertaTokenizerFast.from_pretrained(str(roberta_dir),
                                                                  add_prefix_space=True)
    token_records_of_a_family(roberta_dir, tmp_path, reference)
