"""A RoBERTa checkpoint through the steps: validate's checks, data, tokenize (byte-level BPE in
the TFRecords, equal to RobertaTokenizerFast), train and evaluate (a subprocess, as the CLI
runs them), export (a SavedModel that serves in a fresh interpreter, which the export step
checks, and a Hugging Face folder whose tokenizer loads in transformers); then the same for
token classification, whose entities transformers' pipeline finds too.

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
from test_byte_bpe import CORPUS, train_byte_bpe
from train_helpers import steps_of_a_family

transformers = pytest.importorskip("transformers")

TEXTS = [t for t in CORPUS if t.strip()] * 4


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory) -> Path:
    import tf_keras

    from tasks.model.byte_bpe import read_vocab
    from tasks.model.classifier import build_classifier
    from tasks.model.config import EncoderConfig
    from tasks.model.hf_weights import save_hf_checkpoint

    folder = tmp_path_factory.mktemp("tiny-roberta")
    vocab, _ = train_byte_bpe(folder)
    raw = {"model_type": "roberta", "vocab_size": len(read_vocab(vocab)),
           "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
           "intermediate_size": 64, "max_position_embeddings": 66, "type_vocab_size": 1,
           "layer_norm_eps": 1e-5, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
    tf_keras.utils.set_random_seed(0)
    model = build_classifier(EncoderConfig.from_dict(raw), 2)
    save_hf_checkpoint(model, ["a", "b"], folder)
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
