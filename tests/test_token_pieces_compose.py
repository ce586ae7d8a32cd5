"""The token classification building blocks together, as the steps will wire them: WNUT17
sentences (tasks/io/token_readers.py) -> the tag vocabulary -> WordPieceAligner (tasks/steps/
token_encoding.py) -> batches padded with -100 labels -> a tiny BERT token model
(tasks.model, TOKEN_CLASSIFICATION) trained on tasks/training/token_loss.py's loss -> summed
entity counts (tasks/training/entity_metrics.py) on its predictions. The loss must fall well
below its start on the sentences it trains on. Skipped without /work/shared/data."""
from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest
import tensorflow as tf
import tf_keras

from tasks.io.token_readers import conll_sentences, tag_vocabulary
from tasks.model.classifier import build_classifier
from tasks.model.config import EncoderConfig
from tasks.model.heads import TOKEN_CLASSIFICATION
from tasks.model.token_encoding import WordPieceAligner
from tasks.model.text_encoder import BertTextEncoder
from tasks.training.checkpoint_sources import default_base_model_dir
from tasks.training.entity_metrics import (IGNORED, chunks, count_entity_ids, entity_scores,
                                           entity_types)
from tasks.training.token_loss import global_count, token_loss_sums

WNUT17_TRAIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "wnut17" / "train.conll"


@pytest.mark.skipif(not WNUT17_TRAIN.is_file(), reason=f"{WNUT17_TRAIN} absent (shared data)")
def test_read_align_train_and_count():
    sentences = list(islice(conll_sentences(str(WNUT17_TRAIN)), 32))
    labels = tag_vocabulary(tag for _, _, tags in sentences for tag in tags)
    aligner = WordPieceAligner(BertTextEncoder(default_base_model_dir() / "vocab.txt", True, 48))
    out = aligner.align(
        tf.ragged.constant([tokens for _, tokens, _ in sentences], row_splits_dtype=tf.int64),
        tf.ragged.constant([[labels.index(t) for t in tags] for _, _, tags in sentences],
                           dtype=tf.int64, row_splits_dtype=tf.int64))
    ids = out["input_ids"].to_tensor()
    features = {"input_ids": ids, "token_type_ids": out["token_type_ids"].to_tensor(),
                "attention_mask": tf.ones_like(out["input_ids"]).to_tensor()}
    piece_labels = out["labels"].to_tensor(default_value=IGNORED)  # padding scores nothing

    config = EncoderConfig.from_dict(dict(
        model_type="bert", vocab_size=aligner.encoder.vocab_size, hidden_size=32,
        num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64))
    model = build_classifier(config, len(labels), task=TOKEN_CLASSIFICATION)
    optimizer = tf_keras.optimizers.Adam(3e-3)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            sums, counts = token_loss_sums(piece_labels, model(features, training=True))
            loss = tf.nn.compute_average_loss(
                sums, global_batch_size=global_count(tf.reduce_sum(counts)))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        return loss

    losses = [float(step()) for _ in range(40)]
    print(f"token loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < 0.5 * losses[0]

    predicted = tf.argmax(model(features, training=False), axis=-1).numpy()
    counts = count_entity_ids(piece_labels.numpy(), predicted, labels)
    true_entities = sum(len(chunks(tags)) for _, _, tags in sentences)
    assert counts[:, 0].sum() <= true_entities  # truncation at 48 pieces may drop some
    scores = entity_scores(counts, entity_types(labels))
    assert 0.0 <= scores["f1"] <= 1.0 and set(scores["per_type"]) == set(entity_types(labels))
