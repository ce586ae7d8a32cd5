"""The classifier model: bertflow's encoder and a task head, as one tf_keras.Model."""
from __future__ import annotations

import tensorflow as tf
import tf_keras

from pathlib import Path

from tasks.model.config import EncoderConfig
from tasks.model.encoder import build_encoder
from tasks.model.heads import SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, build_head
from tasks.model.hf_weights import lacks_optional_weights, load_hf_weights
from tasks.model.layers import Dropout, LayerFactory


class Classifier(tf_keras.Model):
    """call(features, training) -> float32 logits [batch, num_labels] ([batch, seq,
    num_labels] for token classification); `features` as the encoder takes them
    (tasks/model/encoder.py)."""

    def __init__(self, config: EncoderConfig, num_labels: int, *, gelu: str,
                 cpu_kernels: bool, task: str = SEQUENCE_CLASSIFICATION,
                 encoder_from_checkpoint: bool = False):
        super().__init__(name=f"{config.prefix}_classifier")
        self.config, self.num_labels, self.task = config, num_labels, task
        make = LayerFactory(config.initializer_range, gelu, cpu_kernels)
        # Token classification reads no pooled output: no pooler, as in transformers.
        self.encoder = build_encoder(config, make.for_loaded_weights()
                                     if encoder_from_checkpoint else make,
                                     with_pooler=task != TOKEN_CLASSIFICATION,
                                     name=config.prefix)
        self.head = build_head(task, config, num_labels, make)

    # Plain Python inside tf.function, for this call and every layer it calls: AutoGraph
    # would rewrite each layer's call in every train, evaluate and export process, seconds
    # of CPU for control flow that is Python over layers, never a branch on a tensor
    # (tasks/training/checkpoint.py, _run_call_unconverted, has the measurements).
    @tf.autograph.experimental.do_not_convert
    def call(self, features, training=None):
        sequence, pooled = self.encoder(features, training=training)
        return tf.cast(self.head(sequence, pooled, training=training), tf.float32)

    def freeze(self, embeddings: bool, layers: int) -> int:
        """Stop training the embeddings and/or the lowest `layers` transformer blocks (as
        `requires_grad = False` does in torch: no gradient, no optimizer update, no weight
        decay; dropout still applies). Call before the optimizer's slots are created and the
        model is compiled. Returns how many weights are frozen."""
        if layers > len(self.encoder.blocks):
            raise ValueError(f"cannot freeze {layers} layers of a {len(self.encoder.blocks)}"
                             f"-layer encoder")
        frozen = ([self.encoder.embeddings] if embeddings else []) + \
            self.encoder.blocks[:layers]
        for layer in frozen:
            layer.trainable = False
        return sum(int(tf.size(v)) for layer in frozen for v in layer.weights)

    def seed_dropout(self, seeds) -> int:
        """Draw every dropout mask from `seeds` (tasks.training.seeded_dropout.DropoutSeeds),
        each layer by its construction index; returns how many dropout layers there are."""
        layers = [layer for layer in self._flatten_layers() if isinstance(layer, Dropout)]
        for layer in layers:
            layer.set_seeds(seeds)
        return len(layers)


def dummy_features() -> dict[str, tf.Tensor]:
    """One row of two tokens: enough to create every variable."""
    ids = tf.zeros([1, 2], tf.int32)
    return {"input_ids": ids, "token_type_ids": ids, "attention_mask": tf.ones_like(ids)}


def build_classifier(config: EncoderConfig, num_labels: int, *, gelu: str | None = None,
                     cpu_kernels: bool = False, task: str = SEQUENCE_CLASSIFICATION,
                     encoder_from_checkpoint: bool = False) -> Classifier:
    """A freshly initialised classifier with its variables created. Call inside
    `strategy.scope()` so the variables are distributed. `encoder_from_checkpoint`: the
    encoder's kernels and embeddings start at zero, for a checkpoint that holds every
    encoder weight to overwrite them (load_classifier).

    `cpu_kernels` runs dropout, LayerNorm and GELU on bertflow's CPU kernels (training and
    evaluation on CPU only; check tasks.model.cpu_kernels.available() first). `gelu`:
    "kernel" (the default with cpu_kernels), "float32" (the default without: exact GELU
    computed in float32 under mixed precision) or "native" (in the compute dtype)."""
    if gelu is None:
        gelu = "kernel" if cpu_kernels else "float32"
    model = Classifier(config, num_labels, gelu=gelu, cpu_kernels=cpu_kernels, task=task,
                       encoder_from_checkpoint=encoder_from_checkpoint)
    model(dummy_features(), training=False)
    return model


def load_classifier(folder: Path | str, num_labels: int, *, keep_head: bool = True,
                    gelu: str | None = None, cpu_kernels: bool = False,
                    task: str = SEQUENCE_CLASSIFICATION) -> Classifier:
    """The classifier of the checkpoint in `folder` (config.json, model.safetensors) with the
    head of `task`, the checkpoint's head kept where `keep_head` and it has one of this
    size. Call inside `strategy.scope()`."""
    config = EncoderConfig.from_pretrained(folder)
    # Every encoder weight comes from the file (a missing one fails the load), unless the
    # file lacks BERT's optional pooler, which then starts random as transformers starts it.
    # The head is always initialised: the file may not have it.
    random_pooler = lacks_optional_weights(folder, config.encoder_family,
                                           with_pooler=task != TOKEN_CLASSIFICATION)
    model = build_classifier(config, num_labels, gelu=gelu, cpu_kernels=cpu_kernels,
                             task=task, encoder_from_checkpoint=not random_pooler)
    load_hf_weights(model, folder, keep_head=keep_head)
    return model
