"""The token classification head (tasks.model.heads.TokenHead) against transformers' PyTorch
*ForTokenClassification (torch side: tests/torch_model_reference.py make-token / load-token,
in the environment of tests/torch_env.py; helpers shared with tests/test_model_parity.py).

- Tiny random BertForTokenClassification, DistilBertForTokenClassification,
  ElectraForTokenClassification, RobertaForTokenClassification and
  DebertaV2ForTokenClassification (two settings) checkpoints load with no fresh weight and give PyTorch's
  logits [batch, seq, labels] within 1e-5 (float32) on a padded batch with token types.
- The default checkpoint (with a pooler) starts a token model; only the classifier is fresh.
- save_hf_checkpoint of each, every weight perturbed, names the token architecture and loads
  in AutoModelForTokenClassification with no missing, unexpected or mismatched keys and the
  same logits within 1e-5.
PyTorch runs twice per session (all families at once).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tasks.model.classifier import build_classifier
from tasks.model.config import EncoderConfig
from tasks.model.heads import TOKEN_CLASSIFICATION, TokenHead
from tasks.model.hf_weights import load_hf_weights
from test_model_parity import (BATCH, FAMILIES, TOLERANCE, check_loaded_alike,
                               export_perturbed, features, max_error, run_torch)

TAGS = ["O", "B-X", "I-X"]
ARCHITECTURES = {"bert": "BertForTokenClassification",
                 "distilbert": "DistilBertForTokenClassification",
                 "electra": "ElectraForTokenClassification",
                 "roberta": "RobertaForTokenClassification",
                 "xlm-roberta": "XLMRobertaForTokenClassification",
                 "deberta-v3": "DebertaV2ForTokenClassification",
                 "deberta-v2": "DebertaV2ForTokenClassification"}


@pytest.fixture(autouse=True)
def float32_policy():
    import tf_keras

    tf_keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(scope="session")
def token_references(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("torch-token-references")
    np.savez(out / "batch.npz", **BATCH)
    run_torch("make-token", out)
    return out


def load(folder: Path):
    model = build_classifier(EncoderConfig.from_pretrained(folder), len(TAGS),
                             task=TOKEN_CLASSIFICATION)
    return model, load_hf_weights(model, folder, keep_head=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_token_logits_match_pytorch(token_references, family):
    model, fresh = load(token_references / family)
    assert fresh == [] and isinstance(model.head, TokenHead)
    logits = model(features(BATCH, family), training=False)
    rows, length = BATCH["input_ids"].shape
    assert logits.shape == (rows, length, len(TAGS))
    error = max_error(logits, np.load(token_references / family / "reference_logits.npy"))
    print(f"{family} token logits max abs error vs PyTorch: {error}")
    assert error < TOLERANCE


@pytest.fixture(scope="session")
def token_exported(token_references, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("token-exported")
    return out, export_perturbed(out, lambda family: load(token_references / family)[0],
                                 TAGS, seed=3, command="load-token")


@pytest.mark.parametrize("family", FAMILIES)
def test_token_export_loads_in_pytorch_with_the_same_logits(token_exported, family):
    out, logits = token_exported
    config = json.loads((out / family / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[family]]
    assert config["id2label"] == {"0": "O", "1": "B-X", "2": "I-X"}
    check_loaded_alike(out / family, logits[family])


def test_a_pretrained_bert_with_a_pooler_starts_a_token_model():
    """The default checkpoint (a BertModel with its pooler): the pooler is ignored, as
    transformers ignores it for BertForTokenClassification; only the classifier is fresh."""
    from tasks.training.checkpoint_sources import default_base_model_dir

    model, fresh = load(default_base_model_dir())
    assert model.encoder.pooler is None
    assert fresh == ["classifier.weight", "classifier.bias"]
