"""Loading base checkpoints: the real offline default (PyTorch safetensors, no torch) and
the errors for incomplete folders (other sources: test_checkpoint_sources.py)."""
import numpy as np
import pytest
from safetensors.numpy import load_file

from tasks.training import checkpoint
from tasks.config import RunConfig
from tasks.errors import BertflowError


def test_default_checkpoint_loads_every_encoder_weight():
    model_dir = checkpoint.resolve_base_model(RunConfig())
    model = checkpoint.load_classifier(model_dir, ["neg", "neutral", "pos"])
    expected = load_file(str(model_dir / checkpoint.SAFETENSORS))
    loaded = {v.name.split("/", 1)[1]: v.numpy() for v in model.weights}

    assert model.config.num_labels == 3
    assert model.config.id2label == {0: "neg", 1: "neutral", 2: "pos"}
    assert loaded["classifier/kernel:0"].shape == (384, 3)
    np.testing.assert_array_equal(loaded["bert/embeddings/word_embeddings/weight:0"],
                                  expected["embeddings.word_embeddings.weight"])
    # Dense kernels are stored transposed in PyTorch.
    np.testing.assert_array_equal(
        loaded["bert/encoder/layer_._5/output/dense/kernel:0"],
        expected["encoder.layer.5.output.dense.weight"].T)
    np.testing.assert_array_equal(loaded["bert/pooler/dense/bias:0"],
                                  expected["pooler.dense.bias"])
    encoder = [k for k in loaded if k.startswith("bert/")]
    assert len(encoder) == len(expected) - 1  # all but the position_ids buffer


def test_default_is_the_packaged_minilm():
    model_dir = checkpoint.resolve_base_model(RunConfig(base_model=""))
    assert model_dir == checkpoint.default_base_model_dir()
    assert checkpoint.vocab_path(model_dir).read_text().startswith("[PAD]")


def test_missing_files_are_named_with_the_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BertflowError, match=f"{tmp_path}.*vocab.txt.*model.safetensors"):
        checkpoint.resolve_base_model(RunConfig(base_model=str(tmp_path)))
    with pytest.raises(BertflowError, match="base_model.*nope not found"):
        checkpoint.resolve_base_model(RunConfig(base_model=str(tmp_path / "nope")))
