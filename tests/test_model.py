"""tasks/model on its own (no PyTorch; tests/test_model_parity.py compares with it):
config.json reading, weights saved and loaded, the CPU kernels, seeded dropout and mixed
precision."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tasks.errors import BertflowError, ConfigError
from tasks.model.classifier import build_classifier, load_classifier
from tasks.model.config import EncoderConfig
from tasks.model.hf_weights import load_hf_weights, save_hf_checkpoint
from tasks.model.layers import Dense, Dropout
from tasks.model import cpu_kernels
from tasks.training import seeded_dropout

FAMILIES = ("bert", "distilbert", "electra")
LABELS = ["neg", "neutral", "pos"]
_BERT_SHAPE = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=37, max_position_embeddings=64)
TINY = {
    "bert": dict(model_type="bert", **_BERT_SHAPE),
    "distilbert": dict(model_type="distilbert", vocab_size=99, dim=32, n_layers=2, n_heads=4,
                       hidden_dim=37, max_position_embeddings=64),
    "electra": dict(model_type="electra", embedding_size=16, **_BERT_SHAPE),
}
# Dropout layers: embeddings, 3 per BERT/ELECTRA block (2 per DistilBERT block), the head's.
DROPOUT_LAYERS = {"bert": 1 + 2 * 3 + 1, "distilbert": 1 + 2 * 2 + 1, "electra": 1 + 2 * 3 + 2}


def tiny(family: str, **overrides) -> EncoderConfig:
    return EncoderConfig.from_dict({**TINY[family], **overrides})


def features() -> dict[str, tf.Tensor]:
    """Two rows, the second padded."""
    return {"input_ids": tf.constant([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]]),
            "token_type_ids": tf.constant([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]),
            "attention_mask": tf.constant([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])}


def copy_weights(source, target) -> None:
    target.set_weights(source.get_weights())


@pytest.fixture(autouse=True)
def float32_policy():
    tf_keras.mixed_precision.set_global_policy("float32")
    yield
    tf_keras.mixed_precision.set_global_policy("float32")


def test_an_unsupported_model_type_is_refused_naming_the_supported_ones():
    with pytest.raises(ConfigError) as refused:
        EncoderConfig.from_dict({"model_type": "t5", **_BERT_SHAPE})
    assert refused.value.field == "base_model"
    assert "'t5'" in str(refused.value)
    assert "bert, distilbert, electra, roberta" in str(refused.value)
    with pytest.raises(ConfigError, match="no model_type"):
        EncoderConfig.from_dict({"vocab_size": 99})


def test_each_family_reads_its_own_keys():
    assert EncoderConfig.from_dict(_BERT_SHAPE).family == "bert"  # no model_type: BERT's keys
    bert = tiny("bert", classifier_dropout=None, hidden_dropout_prob=0.15)
    assert (bert.hidden_size, bert.num_layers, bert.num_heads, bert.intermediate_size,
            bert.type_vocab_size, bert.classifier_dropout) == (32, 2, 4, 37, 2, 0.15)
    assert tiny("bert", classifier_dropout=0.3).classifier_dropout == 0.3
    distil = tiny("distilbert", activation="relu", dropout=0.05, seq_classif_dropout=0.25,
                  sinusoidal_pos_embds=True)
    assert (distil.hidden_size, distil.embedding_size, distil.num_layers, distil.num_heads,
            distil.intermediate_size, distil.hidden_act, distil.type_vocab_size,
            distil.layer_norm_eps, distil.hidden_dropout, distil.classifier_dropout,
            distil.frozen_positions) == (32, 32, 2, 4, 37, "relu", 0, 1e-12, 0.05, 0.25, True)
    sinusoidal = build_classifier(distil, len(LABELS)).encoder.embeddings.position_embeddings
    assert not sinusoidal.trainable
    electra = tiny("electra")
    assert (electra.embedding_size, electra.hidden_size) == (16, 32)
    with pytest.raises(ConfigError, match="relative_key"):
        tiny("bert", position_embedding_type="relative_key")


def test_the_exported_config_names_the_architecture_and_labels():
    config = EncoderConfig.from_dict({**_BERT_SHAPE, "num_labels": 2, "pad_token_id": 1})
    exported = config.to_hf_config(LABELS)
    assert exported["model_type"] == "bert"
    assert exported["architectures"] == ["BertForSequenceClassification"]
    assert exported["id2label"] == {"0": "neg", "1": "neutral", "2": "pos"}
    assert exported["label2id"] == {"neg": 0, "neutral": 1, "pos": 2}
    assert "num_labels" not in exported and exported["pad_token_id"] == 1
    assert tiny("distilbert").to_hf_config(LABELS)["architectures"] == [
        "DistilBertForSequenceClassification"]


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_weights_load_back_identical(tmp_path, family):
    saved = build_classifier(tiny(family), len(LABELS))
    save_hf_checkpoint(saved, LABELS, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["id2label"]["2"] == "pos"
    loaded = build_classifier(EncoderConfig.from_pretrained(tmp_path), len(LABELS))
    assert load_hf_weights(loaded, tmp_path, keep_head=True) == []
    for ours, theirs in zip(loaded.weights, saved.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.name)


def test_a_head_not_kept_or_of_another_size_starts_fresh(tmp_path):
    saved = build_classifier(tiny("distilbert"), len(LABELS))
    save_hf_checkpoint(saved, LABELS, tmp_path)
    model = build_classifier(tiny("distilbert"), len(LABELS))
    initial = model.head.classifier.kernel.numpy()
    assert load_hf_weights(model, tmp_path, keep_head=False) == [
        "pre_classifier.weight", "pre_classifier.bias", "classifier.weight", "classifier.bias"]
    np.testing.assert_array_equal(model.head.classifier.kernel.numpy(), initial)
    np.testing.assert_array_equal(model.encoder.blocks[1].attention.query.kernel.numpy(),
                                  saved.encoder.blocks[1].attention.query.kernel.numpy())
    two_labels = build_classifier(tiny("distilbert"), 2)
    assert load_hf_weights(two_labels, tmp_path, keep_head=True) == [
        "classifier.weight", "classifier.bias"]
    np.testing.assert_array_equal(two_labels.head.pre_classifier.kernel.numpy(),
                                  saved.head.pre_classifier.kernel.numpy())


def test_bare_legacy_checkpoints_with_other_heads_load(tmp_path):
    """No `bert.` prefix, LayerNorm gamma/beta, a position_ids buffer, a pretraining head
    and no pooler: the encoder loads, the pooler starts fresh."""
    from safetensors.numpy import load_file, save_file

    saved = build_classifier(tiny("bert"), len(LABELS))
    save_hf_checkpoint(saved, LABELS, tmp_path)
    state = {}
    for key, value in load_file(str(tmp_path / "model.safetensors")).items():
        if key.startswith("bert.") and not key.startswith("bert.pooler."):
            key = key[len("bert."):].replace("LayerNorm.weight", "LayerNorm.gamma")
            state[key.replace("LayerNorm.bias", "LayerNorm.beta")] = value
    state["embeddings.position_ids"] = np.arange(64)[None]
    state["cls.predictions.bias"] = np.zeros(99, np.float32)
    save_file(state, str(tmp_path / "model.safetensors"))
    model = build_classifier(EncoderConfig.from_pretrained(tmp_path), len(LABELS))
    assert load_hf_weights(model, tmp_path, keep_head=True) == [
        "pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias"]
    np.testing.assert_array_equal(model.encoder.blocks[0].attention_layer_norm.gamma.numpy(),
                                  saved.encoder.blocks[0].attention_layer_norm.gamma.numpy())


@pytest.mark.parametrize("family", FAMILIES)
def test_load_classifier_draws_random_values_only_where_the_file_has_none(tmp_path, family):
    """The encoder's kernels start at zero (the file overwrites every one of them); the head,
    and BERT's pooler when the file lacks it, start normal(initializer_range) as
    transformers starts them; dropout layers keep one numbering across encoder and head."""
    from safetensors.numpy import load_file, save_file

    saved = build_classifier(tiny(family), len(LABELS))
    save_hf_checkpoint(saved, LABELS, tmp_path)
    std = tiny(family).initializer_range
    model = load_classifier(tmp_path, 2)  # another head size: the head starts fresh
    assert model.encoder.embeddings.make.zero_kernels  # no random draws to overwrite
    for ours, theirs in zip(model.encoder.weights, saved.encoder.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.name)
    head = [w.numpy() for w in model.head.weights if w.shape.rank == 2]
    assert head and all(0.5 * std < w.std() < 1.5 * std for w in head)
    indices = [layer.index for layer in model._flatten_layers() if isinstance(layer, Dropout)]
    assert sorted(indices) == list(range(DROPOUT_LAYERS[family]))
    if family != "bert":
        return
    state = {k: v for k, v in load_file(str(tmp_path / "model.safetensors")).items()
             if not k.startswith("bert.pooler.")}
    save_file(state, str(tmp_path / "model.safetensors"))
    without_pooler = load_classifier(tmp_path, 2)
    assert not without_pooler.encoder.embeddings.make.zero_kernels
    pooler = without_pooler.encoder.pooler.kernel.numpy()
    assert 0.5 * std < pooler.std() < 1.5 * std  # random, as transformers starts it


def test_a_checkpoint_that_does_not_match_its_config_names_the_file(tmp_path):
    save_hf_checkpoint(build_classifier(tiny("bert"), len(LABELS)), LABELS, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 40}))
    with pytest.raises(BertflowError) as wrong:
        load_classifier(tmp_path, len(LABELS))
    message = str(wrong.value)
    assert str(tmp_path / "model.safetensors") in message
    assert ("mismatched ['encoder.layer.0.intermediate.dense.weight (37, 32) in the file, "
            "(40, 32) by config.json'") in message
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(BertflowError, match=r"missing \['encoder\.layer\.2\."):
        load_classifier(tmp_path, len(LABELS))
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.raises(BertflowError, match=r"unexpected \['encoder\.layer\.1\."):
        load_classifier(tmp_path, len(LABELS))


def inference_and_gradients(model):
    labels = tf.constant([0, 2])
    with tf.GradientTape() as tape:
        logits = model(features(), training=False)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    grads = tape.gradient(loss, model.trainable_variables)
    return logits.numpy(), [tf.convert_to_tensor(g).numpy() for g in grads]


@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_kernels_agree_with_tensorflow_ops(family):
    if not cpu_kernels.available():
        pytest.skip(f"bertflow CPU kernels not built ({cpu_kernels.library_path().name}; "
                    "`python -m tasks.model.cpu_kernels build`)")
    stock = build_classifier(tiny(family), len(LABELS))
    kernels = build_classifier(tiny(family), len(LABELS), cpu_kernels=True)
    copy_weights(stock, kernels)
    (stock_logits, stock_grads), (logits, grads) = map(inference_and_gradients,
                                                      (stock, kernels))
    np.testing.assert_allclose(logits, stock_logits, rtol=1e-5, atol=1e-6)
    for ours, theirs, variable in zip(grads, stock_grads, stock.trainable_variables):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6, err_msg=variable.name)


@pytest.mark.parametrize("family,use_kernels", [("bert", False), ("electra", False),
                                                ("distilbert", True)])
def test_seeded_dropout_masks_follow_the_seed_and_step(family, use_kernels):
    if use_kernels and not cpu_kernels.available():
        pytest.skip("bertflow CPU kernels not built")
    config = tiny(family, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2,
                  dropout=0.2, attention_dropout=0.2)
    first = build_classifier(config, len(LABELS), cpu_kernels=use_kernels)
    second = build_classifier(config, len(LABELS), cpu_kernels=use_kernels)
    copy_weights(first, second)
    step = tf.Variable(0, dtype=tf.int64)
    seeds = seeded_dropout.DropoutSeeds(7, step)
    assert first.seed_dropout(seeds) == second.seed_dropout(seeds) == DROPOUT_LAYERS[family]
    indices = [layer.index for layer in first._flatten_layers() if isinstance(layer, Dropout)]
    assert sorted(indices) == list(range(DROPOUT_LAYERS[family]))

    at_step_0 = first(features(), training=True).numpy()
    np.testing.assert_array_equal(second(features(), training=True).numpy(), at_step_0)
    np.testing.assert_array_equal(first(features(), training=True).numpy(), at_step_0)
    step.assign(1)
    assert not np.allclose(first(features(), training=True).numpy(), at_step_0)
    assert not np.allclose(first(features(), training=False).numpy(), at_step_0)
    assert step.ref() not in {v.ref() for v in first.variables}  # the optimizer's, not the model's


@pytest.mark.parametrize("use_kernels", [False, True])
def test_mixed_bfloat16_keeps_float32_weights_and_logits(use_kernels):
    if use_kernels and not cpu_kernels.available():
        pytest.skip("bertflow CPU kernels not built")
    reference = build_classifier(tiny("electra"), len(LABELS))
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = build_classifier(tiny("electra"), len(LABELS), cpu_kernels=use_kernels)
    copy_weights(reference, model)
    sequence, _ = model.encoder(features())
    logits = model(features(), training=False)
    assert sequence.dtype == tf.bfloat16 and logits.dtype == tf.float32
    assert {v.dtype for v in model.variables} == {tf.float32}
    np.testing.assert_allclose(logits.numpy(), reference(features()).numpy(), atol=0.02)


def test_trains_under_fit():
    model = build_classifier(tiny("bert"), len(LABELS))
    before = [w.copy() for w in model.get_weights()]
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-3),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensors((features(), tf.constant([0, 2]))).repeat(3)
    history = model.fit(data, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert all(not np.array_equal(b, a) for b, a in zip(before, model.get_weights()))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_dense_on_sequences_is_keras_dense_in_fewer_graph_ops(policy):
    """The encoder's Dense multiplies [batch, seq, features] as rows: the same values and
    gradients as Keras' tensordot, bit for bit, without tensordot's shape arithmetic."""
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        ours = Dense(6, activation="tanh")
        keras = tf_keras.layers.Dense(6, activation="tanh")
        x = tf.random.stateless_normal([3, 5, 4], seed=[1, 2])
        ours.build(x.shape)
        keras.build(x.shape)
        keras.set_weights(ours.get_weights())

        def run(layer):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x)
                loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
            grads = tape.gradient(loss, [x, *layer.trainable_variables])
            graph = tf.function(layer).get_concrete_function(
                tf.TensorSpec([None, None, 4])).graph
            return (y, grads), {op.type for op in graph.get_operations()}

        (y_ours, grads_ours), ops_ours = run(ours)
        (y_keras, grads_keras), ops_keras = run(keras)
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    assert y_ours.shape == [3, 5, 6] and y_ours.dtype == y_keras.dtype
    np.testing.assert_array_equal(y_ours.numpy(), y_keras.numpy())
    for a, b in zip(grads_ours, grads_keras):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert {"Prod", "GatherV2"} <= ops_keras and not {"Prod", "GatherV2"} & ops_ours
