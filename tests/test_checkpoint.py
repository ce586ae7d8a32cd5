"""Loading base checkpoints: the real offline default (PyTorch safetensors, no torch) and
the errors for incomplete folders (other sources: test_checkpoint_sources.py)."""
import numpy as np
import pytest
from safetensors.numpy import load_file

from tasks.training import checkpoint
from tasks.config import RunConfig
from tasks.errors import BertflowError

from train_helpers import tiny_model_dir  # noqa: F401  (fixture)


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


def test_the_model_runs_unconverted_inside_tf_function(tiny_model_dir, monkeypatch):  # noqa: F811
    """Keras would rewrite transformers' layer calls with AutoGraph in every tf.function
    (seconds of CPU per process); load_classifier opts the model out. Every function
    AutoGraph converts while a tf.function calls the model is recorded here: none may be
    transformers' code, and the call still computes the eager result."""
    import tensorflow as tf
    from tensorflow.python.autograph.impl import api

    from train_helpers import tiny_batch

    converted = []
    convert = api._convert_actual

    def recording(entity, program_ctx):
        converted.append(f"{getattr(entity, '__module__', '?')}.{entity.__qualname__}")
        return convert(entity, program_ctx)

    monkeypatch.setattr(api, "_convert_actual", recording)
    model = checkpoint.load_classifier(tiny_model_dir, ["neg", "pos"])
    batch = tiny_batch()

    @tf.function
    def logits(features):
        return model(features, training=False).logits

    np.testing.assert_allclose(logits(batch).numpy(),
                               model(batch, training=False).logits.numpy(), atol=1e-5)
    assert converted, "AutoGraph converted nothing: the recording hook is not in place"
    assert not [name for name in converted if name.startswith("transformers.")], converted
