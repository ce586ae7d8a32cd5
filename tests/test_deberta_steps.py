"""DeBERTa-v3 end to end: the in-graph SentencePiece encoder (tasks/model/sentencepiece_text.py
DebertaTextEncoder) against transformers' DebertaV2Tokenizer (the fast one), validate's checks,
then data, tokenize, train, evaluate and export (tests/train_helpers.py steps_of_a_family).

A tiny unigram model with DeBERTa-v3's first pieces is trained with the sentencepiece package
(a test dependency; tests/family_checkpoints.py train_deberta_spm). The checkpoint is tiny and
random, written by bertflow's own save (tasks/model/hf_weights.py, whose DeBERTa keys
tests/test_model_parity.py checks against PyTorch's).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tasks.config import RunConfig
from tasks.errors import BertflowError, ConfigError
from tasks.model.sentencepiece_model import read_model
from tasks.model.sentencepiece_text import RUST_WHITESPACE, DebertaTextEncoder
from tasks.training import checkpoint
from family_checkpoints import DEBERTA_SPM, tiny_deberta
from test_byte_bpe import CORPUS
from test_sentencepiece_text import MULTILINGUAL, UNSEEN
from train_helpers import (aligned_as_transformers, copy_checkpoint, refusals_of_a_family,
                           steps_of_a_family, token_records_of_a_family)

transformers = pytest.importorskip("transformers")

SPACES = ["  two  spaces\tand\ttabs  ", "end\u3000ideographic\u00a0nbsp", "a\u0085b\u2028c",
          "multiple     spaces    inside", "   leading", "trailing   "]
TEXTS = CORPUS + MULTILINGUAL + UNSEEN + SPACES


@pytest.fixture(scope="module")
def deberta_dir(tmp_path_factory) -> Path:
    return tiny_deberta(tmp_path_factory.mktemp("tiny-deberta"))


@pytest.fixture(scope="module")
def hf(deberta_dir):
    tokenizer = transformers.DebertaV2Tokenizer.from_pretrained(str(deberta_dir))
    assert tokenizer.backend_tokenizer.model.__class__.__name__ == "Unigram"
    return tokenizer


@pytest.fixture(scope="module")
def encoder(deberta_dir):
    return DebertaTextEncoder(deberta_dir / DEBERTA_SPM, max_seq_length=512)


def test_special_ids_are_read_from_the_model(encoder, hf, deberta_dir):
    _, model = read_model(deberta_dir / DEBERTA_SPM)
    assert sum(len(p) > 1 for p in model.pieces) > 60  # real pieces, not single characters
    assert (encoder.pad_id, encoder.cls_id, encoder.sep_id, encoder.unk_id) == (0, 1, 2, 3)
    assert hf.convert_tokens_to_ids(["[PAD]", "[CLS]", "[SEP]", "[UNK]"]) == [0, 1, 2, 3]
    assert hf.mask_token_id == len(model.pieces)  # added after the pieces, as in v3


def test_ids_and_token_types_equal_the_fast_tokenizer(encoder, hf):
    ids, types, _ = encoder.encode_with_lengths(tf.constant(TEXTS))
    want = hf(TEXTS)
    assert ids.to_list() == want["input_ids"]
    assert types.to_list() == want["token_type_ids"]
    assert encoder.unk_id in encoder.wordpieces(tf.constant(UNSEEN)).flat_values.numpy()
    # Every whitespace character between letters, after a space and doubled.
    texts = [f"a{c}b {c}{c}1 x{c}y" for c in RUST_WHITESPACE]
    assert (encoder.wordpieces(tf.constant(texts)).to_list()
            == hf(texts, add_special_tokens=False)["input_ids"])


def test_pairs_and_truncation_equal_the_fast_tokenizer(encoder, hf, deberta_dir):
    firsts = CORPUS[:9] + MULTILINGUAL[:3] + SPACES[:2] + ["short", ""]
    seconds = (list(reversed(CORPUS[:9])) + MULTILINGUAL[3:6] + SPACES[2:4]
               + ["a much longer text " * 4, "x"])
    ids, types, _ = encoder.encode_with_lengths(tf.constant(firsts), tf.constant(seconds))
    want = hf(firsts, seconds)
    assert ids.to_list() == want["input_ids"]
    assert types.to_list() == want["token_type_ids"]  # 0 then 1
    assert np.any(types.flat_values.numpy())
    for max_len in (6, 17):
        short = DebertaTextEncoder(deberta_dir / DEBERTA_SPM, max_seq_length=max_len)
        assert (short.encode_with_lengths(tf.constant(TEXTS))[0].to_list()
                == hf(TEXTS, truncation=True, max_length=max_len)["input_ids"])
        pair_ids, _, _ = short.encode_with_lengths(tf.constant(firsts), tf.constant(seconds))
        assert pair_ids.to_list() == hf(firsts, seconds, truncation="longest_first",
                                        max_length=max_len)["input_ids"]


def test_token_pieces_and_labels_equal_is_split_into_words(deberta_dir, hf):
    """Token classification's input (first-piece labels) as transformers builds it."""
    aligned_as_transformers(deberta_dir, hf)


def test_validate_names_the_model_file_the_casing_and_the_vocabulary(deberta_dir, tmp_path):
    pieces = len(read_model(deberta_dir / DEBERTA_SPM)[1].pieces)
    refusals_of_a_family(deberta_dir, tmp_path, DEBERTA_SPM, "deberta-v2", pieces)
    with pytest.raises(ConfigError, match="tokenizer_config.json do_lower_case: cased"):
        checkpoint.casing(deberta_dir, RunConfig(base_model=str(deberta_dir), lower_case=True))
    lowered = copy_checkpoint(deberta_dir, tmp_path / "lowered", files={
        "tokenizer_config.json": '{"do_lower_case": true}'})
    with pytest.raises(ConfigError, match="do_lower_case true; bertflow's in-graph "
                                          "SentencePiece tokenizer does not lower-case"):
        checkpoint.casing(lowered, RunConfig(base_model=str(lowered)))
    with pytest.raises(BertflowError, match="SentencePiece model does not lower-case"):
        checkpoint.text_encoder(deberta_dir, True, 32)


def test_tokenize_train_evaluate_export(deberta_dir, hf, tmp_path):
    texts = [t for t in CORPUS + MULTILINGUAL if t.strip()] * 3
    manifest, folder, prepared = steps_of_a_family(deberta_dir, tmp_path, texts, hf)
    assert manifest["lower_case"] is False
    assert manifest["lower_case_rule"] == "tokenizer_config.json do_lower_case"
    assert (folder / DEBERTA_SPM).read_bytes() == (deberta_dir / DEBERTA_SPM).read_bytes()
    assert (folder / "tokenizer.json").is_file()  # written without the sentencepiece package
    exported = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert type(exported).__name__ == "DebertaV2Tokenizer"
    sample = prepared[:6] + MULTILINGUAL + SPACES
    assert exported(sample)["input_ids"] == hf(sample)["input_ids"]
    assert exported(sample[:3], sample[3:6])["token_type_ids"] == hf(
        sample[:3], sample[3:6])["token_type_ids"]
    assert exported.model_max_length == 24
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DebertaV2ForSequenceClassification"]
    assert config["model_type"] == "deberta-v2"


def test_token_classification_records_are_transformers(deberta_dir, hf, tmp_path):
    """The TFRecords hold transformers' is_split_into_words ids and first-piece labels, cut
    where it cuts them. Training, evaluation, the export and the pipeline's entities for this
    family: tests/test_dag_tokens.py[deberta-v2], through the whole DAG."""
    token_records_of_a_family(deberta_dir, tmp_path, hf)
