"""Loading base checkpoints: the real offline default (PyTorch safetensors, no torch) and
the errors for incomplete folders (other sources: test_checkpoint_sources.py)."""
import numpy as np
import pytest
from safetensors.numpy import load_file

from tasks.training import checkpoint, checkpoint_sources
from tasks.config import RunConfig
from tasks.errors import BertflowError

from train_helpers import tiny_model_dir  # noqa: F401  (fixture)


def test_default_checkpoint_loads_every_encoder_weight():
    from tasks.model import hf_weights

    model_dir = checkpoint.resolve_base_model(RunConfig())
    model = checkpoint.load_classifier(model_dir, ["neg", "neutral", "pos"])
    expected = load_file(str(model_dir / checkpoint.SAFETENSORS))
    encoder = hf_weights.encoder_parameters(model)

    assert model.config.family == "bert" and model.num_labels == 3
    assert model.head.classifier.kernel.shape == (384, 3)
    # Every weight of the file (a bare BertModel: no "bert." prefix) but the position_ids
    # buffer is one of the encoder's variables, value for value.
    assert set(encoder) == set(expected) - {"embeddings.position_ids"}
    for key, (variable, transposed) in encoder.items():
        value = expected[key].T if transposed else expected[key]  # Dense kernels: [in, out]
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=key)
    assert encoder["encoder.layer.5.output.dense.weight"][1]  # a kernel, stored transposed


def test_default_is_the_packaged_minilm():
    model_dir = checkpoint.resolve_base_model(RunConfig(base_model=""))
    assert model_dir == checkpoint_sources.default_base_model_dir()
    assert checkpoint.vocab_path(model_dir).read_text().startswith("[PAD]")


def test_missing_files_are_named_with_the_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BertflowError, match=f"{tmp_path}.*vocab.txt.*model.safetensors"):
        checkpoint.resolve_base_model(RunConfig(base_model=str(tmp_path)))
    with pytest.raises(BertflowError, match="base_model.*nope not found"):
        checkpoint.resolve_base_model(RunConfig(base_model=str(tmp_path / "nope")))


def test_the_model_runs_unconverted_inside_tf_function(tiny_model_dir, monkeypatch):  # noqa: F811
    """Keras would rewrite the model's layer calls with AutoGraph in every tf.function
    (seconds of CPU per process); the model opts out. Every function AutoGraph converts
    while a tf.function calls the model is recorded here: none may be the model's code, and
    the call still computes the eager result."""
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
        return model(features, training=False)

    np.testing.assert_allclose(logits(batch).numpy(),
                               model(batch, training=False).numpy(), atol=1e-5)
    assert converted, "AutoGraph converted nothing: the recording hook is not in place"
    assert not [name for name in converted if name.startswith("tasks.model")], converted
