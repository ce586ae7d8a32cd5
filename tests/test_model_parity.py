"""tasks/model against transformers' PyTorch classes (the torch environment of
tests/torch_env.py; its side is tests/torch_model_reference.py).

- A tiny random BERT (GELU), DistilBERT (ReLU), ELECTRA (tanh GELU, embedding size 16,
  hidden size 32), RoBERTa (positions from pad_token_id + 1, one token type, tanh head) and
  XLM-R (RoBERTa's modules, XLM-R's classes), and DeBERTa-v2 in two settings (v3's:
  relative positions only, log buckets, shared position projections; and absolute positions,
  token types, own projections, clipped distances),
  each written by its *ForSequenceClassification: bertflow's model loads the checkpoint and gives
  PyTorch's last hidden state, pooled output (BERT) and logits within 1e-5, on a padded
  batch with token types; the weights it saves carry exactly PyTorch's key names.
- DeBERTa's log buckets of relative positions equal transformers' over distances
  -1100..1100 in three settings (v3's 256 buckets and 512 positions among them).
- The default MiniLM checkpoint (a bare BertModel, no `bert.` prefix): last hidden state and
  pooler output within 1e-5 of PyTorch's BertModel.
- Export: what save_hf_checkpoint writes of a perturbed model loads in PyTorch's
  AutoModelForSequenceClassification with no missing, unexpected or mismatched keys and
  gives bertflow's logits within 1e-5.
PyTorch runs twice per session (all families at once): once to write the checkpoints and
references, once to load the exports.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

import torch_env
from tasks.model.classifier import build_classifier
from tasks.model.config import EncoderConfig
from tasks.model.hf_weights import load_hf_weights, save_hf_checkpoint

# Cases by family; "deberta-v3" and "deberta-v2" are two settings of model_type deberta-v2
# (tests/torch_model_reference.py MODELS).
FAMILIES = ("bert", "distilbert", "electra", "roberta", "xlm-roberta",
            "deberta-v3", "deberta-v2")
LABELS = ["neg", "neutral", "pos"]
TOLERANCE = 1e-5
SCRIPT = Path(__file__).resolve().parent / "torch_model_reference.py"


def batch(vocab: int, rows: int, length: int, seed: int) -> dict[str, np.ndarray]:
    """Random ids with [CLS]-like id 2 first; row i has i padding positions (mask 0, id 1:
    RoBERTa's pad id, from which transformers' RoBERTa tells padding; the other families read
    the mask only); token type 1 on the second half of each row."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=(rows, length))
    ids[:, 0] = 2
    mask = np.ones_like(ids)
    for row in range(rows):
        if row:
            mask[row, -row:] = 0
    types = np.zeros_like(ids)
    types[:, length // 2:] = 1
    return {"input_ids": ids * mask + (1 - mask), "token_type_ids": types * mask,
            "attention_mask": mask}


BATCH = batch(99, rows=3, length=9, seed=0)
MINILM_BATCH = batch(30522, rows=4, length=16, seed=1)


def run_torch(*args) -> None:
    try:
        python = torch_env.python()
    except torch_env.Unavailable as missing:
        pytest.skip(f"no PyTorch environment: {missing}")
    with tempfile.TemporaryDirectory() as cwd:  # so `tasks` is not importable there
        done = subprocess.run([str(python), str(SCRIPT), *map(str, args)], cwd=cwd,
                              capture_output=True, text=True, timeout=600,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if done.returncode:
        raise AssertionError(f"{SCRIPT.name} {args[0]} failed:\n{done.stderr[-3000:]}")


def features(arrays: dict[str, np.ndarray], family: str = "bert") -> dict:
    """The batch as bertflow's model takes it; RoBERTa's token types all 0 (it has one),
    as transformers fills them in when given none (torch_model_reference.inputs)."""
    import tensorflow as tf

    out = {name: tf.constant(arrays[name], tf.int32)
           for name in ("input_ids", "token_type_ids", "attention_mask")}
    if family in ("roberta", "xlm-roberta"):
        out["token_type_ids"] = tf.zeros_like(out["token_type_ids"])
    return out


@pytest.fixture(scope="session")
def references(tmp_path_factory) -> Path:
    """The torch-written checkpoints and their outputs (one PyTorch process)."""
    from tasks.training.checkpoint_sources import default_base_model_dir

    out = tmp_path_factory.mktemp("torch-references")
    np.savez(out / "batch.npz", **BATCH, **{f"minilm_{k}": v for k, v in MINILM_BATCH.items()})
    run_torch("make", out, default_base_model_dir())
    return out


@pytest.fixture(autouse=True)
def float32_policy():
    import tf_keras

    tf_keras.mixed_precision.set_global_policy("float32")


def load(folder: Path, num_labels: int = len(LABELS)):
    model = build_classifier(EncoderConfig.from_pretrained(folder), num_labels)
    fresh = load_hf_weights(model, folder, keep_head=True)
    return model, fresh


def max_error(ours, theirs) -> float:
    assert ours.shape == theirs.shape
    return float(np.max(np.abs(np.asarray(ours) - theirs)))


@pytest.mark.parametrize("family", FAMILIES)
def test_outputs_match_pytorch(references, family):
    model, fresh = load(references / family)
    assert fresh == []
    expected = np.load(references / family / "reference.npz")
    sequence, pooled = model.encoder(features(BATCH, family), training=False)
    errors = {"last_hidden_state": max_error(sequence, expected["last_hidden_state"]),
              "logits": max_error(model(features(BATCH, family), training=False),
                                  expected["logits"])}
    if family == "bert":
        errors["pooler_output"] = max_error(pooled, expected["pooler_output"])
    else:
        assert pooled is None
    print(f"{family} max abs error vs PyTorch: {errors}")
    assert max(errors.values()) < TOLERANCE, errors


def test_deberta_log_buckets_match_pytorch(references):
    import tensorflow as tf

    from tasks.model.deberta import log_bucket_positions

    expected = np.load(references / "log_buckets.npz")
    distances = tf.constant(expected["distances"], tf.int32)
    for setting in (name for name in expected.files if name != "distances"):
        size, top = map(int, setting.split("_"))
        ours = tf.function(log_bucket_positions)(distances, size, top).numpy()
        np.testing.assert_array_equal(ours, expected[setting], err_msg=setting)


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_keys_are_pytorch_keys(references, tmp_path, family):
    from safetensors.numpy import load_file

    model, _ = load(references / family)
    save_hf_checkpoint(model, LABELS, tmp_path)
    theirs = load_file(str(references / family / "model.safetensors"))
    ours = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)


def test_default_checkpoint_matches_pytorch_bert_model(references):
    from tasks.training.checkpoint_sources import default_base_model_dir

    model, fresh = load(default_base_model_dir(), num_labels=2)
    assert fresh == ["classifier.weight", "classifier.bias"]  # a bare encoder: no head
    expected = np.load(references / "minilm.npz")
    sequence, pooled = model.encoder(features(MINILM_BATCH), training=False)
    errors = {"last_hidden_state": max_error(sequence, expected["last_hidden_state"]),
              "pooler_output": max_error(pooled, expected["pooler_output"])}
    print(f"MiniLM max abs error vs PyTorch BertModel: {errors}")
    assert max(errors.values()) < TOLERANCE, errors


def export_perturbed(out: Path, load_model, labels: list[str], seed: int,
                     command: str) -> dict:
    """Each family's `load_model(family)` with every weight perturbed, saved by
    save_hf_checkpoint into out/<family> and loaded by PyTorch (`command` of
    torch_model_reference.py, one process); bertflow's logits by family."""
    np.savez(out / "batch.npz", **BATCH)
    rng = np.random.default_rng(seed)
    logits = {}
    for family in FAMILIES:
        model = load_model(family)
        for variable in model.weights:
            variable.assign_add(rng.normal(0, 0.05, variable.shape).astype(np.float32))
        save_hf_checkpoint(model, labels, out / family)
        logits[family] = model(features(BATCH, family), training=False).numpy()
    run_torch(command, *(out / family for family in FAMILIES))
    return logits


def check_loaded_alike(folder: Path, logits: np.ndarray) -> None:
    """PyTorch loaded `folder` with no missing, unexpected or mismatched key, and gave
    `logits` within TOLERANCE."""
    info = json.loads((folder / "loading_info.json").read_text())
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                    "error_msgs": []}
    error = max_error(logits, np.load(folder / "torch_logits.npy"))
    print(f"{folder.name} export: PyTorch logits max abs error {error}")
    assert error < TOLERANCE


@pytest.fixture(scope="session")
def exported(references, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("exported")
    return out, export_perturbed(out, lambda family: load(references / family)[0], LABELS,
                                 seed=2, command="load")


@pytest.mark.parametrize("family", FAMILIES)
def test_export_loads_in_pytorch_with_the_same_logits(exported, family):
    out, logits = exported
    check_loaded_alike(out / family, logits[family])
