"""An XLM-RoBERTa checkpoint through the steps: validate's checks, data, tokenize (the in-graph
SentencePiece model's ids in the TFRecords, equal to transformers' XLMRobertaTokenizer), train
and evaluate (a subprocess, as the CLI runs them), export (a SavedModel that serves in a fresh
interpreter, which the export step checks, and a Hugging Face folder whose tokenizer loads in
transformers with the same ids).

The checkpoint is tiny and random, written by bertflow's own save (tasks/model/hf_weights.py,
whose XLM-R keys tests/test_model_parity.py checks against PyTorch's) beside a SentencePiece
model trained here (tests/test_sentencepiece_text.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.config import RunConfig
from tasks.errors import BertflowError, ConfigError
from tasks.training import checkpoint
from test_byte_bpe import CORPUS
from family_checkpoints import tiny_xlm_roberta
from test_sentencepiece_text import MULTILINGUAL
from train_helpers import (aligned_as_transformers, refusals_of_a_family, steps_of_a_family,
                           token_records_of_a_family)

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

TEXTS = [t for t in CORPUS + MULTILINGUAL if t.strip()] * 3
MODEL_FILE = "sentencepiece.bpe.model"


@pytest.fixture(scope="module")
def xlmr_dir(tmp_path_factory) -> Path:
    return tiny_xlm_roberta(tmp_path_factory.mktemp("tiny-xlmr"))


def test_validate_names_the_model_file_the_casing_and_the_vocabulary(xlmr_dir, tmp_path):
    size = json.loads((xlmr_dir / "config.json").read_text())["vocab_size"]
    refusals_of_a_family(xlmr_dir, tmp_path, MODEL_FILE, "xlm-roberta", size)
    cased = RunConfig(base_model=str(xlmr_dir), lower_case=True)
    with pytest.raises(ConfigError, match="its SentencePiece model reads text as it is"):
        checkpoint.casing(xlmr_dir, cased)
    with pytest.raises(BertflowError, match="SentencePiece model does not lower-case"):
        checkpoint.text_encoder(xlmr_dir, True, 32)


def test_tokenize_train_evaluate_export(xlmr_dir, tmp_path):
    reference = transformers.XLMRobertaTokenizer.from_pretrained(str(xlmr_dir))
    manifest, folder, prepared = steps_of_a_family(xlmr_dir, tmp_path, TEXTS, reference)
    assert manifest["lower_case"] is False
    assert manifest["lower_case_rule"] == ("xlm-roberta: its SentencePiece model reads text "
                                           "as it is")
    assert (folder / MODEL_FILE).read_bytes() == (xlmr_dir / MODEL_FILE).read_bytes()
    assert (folder / "tokenizer.json").is_file()  # written without the sentencepiece package
    exported = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert type(exported).__name__ == "XLMRobertaTokenizer"
    texts = prepared[:6] + MULTILINGUAL
    assert exported(texts)["input_ids"] == reference(texts)["input_ids"]
    assert exported.model_max_length == 24
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["XLMRobertaForSequenceClassification"]
    assert config["model_type"] == "xlm-roberta"


def test_token_pieces_and_labels_equal_is_split_into_words(xlmr_dir):
    aligned_as_transformers(xlmr_dir, transformers.XLMRobertaTokenizer.from_pretrained(
        str(xlmr_dir)))


def test_token_classification_records_are_transformers(xlmr_dir, tmp_path):
    """The TFRecords hold transformers' is_split_into_words ids and first-piece labels, cut
    where it cuts them. Training, evaluation, the export and the pipeline's entities for this
    family: tests/test_dag_tokens.py[xlm-roberta], through the whole DAG."""
    reference = transformers.XLMRobertaTokenizer.from_pretrained(str(xlmr_dir))
    token_records_of_a_family(xlmr_dir, tmp_path, reference)
