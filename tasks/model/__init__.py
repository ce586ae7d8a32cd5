"""bertflow's own BERT-family encoder and task heads in tf_keras (no transformers).

    config = EncoderConfig.from_pretrained(folder)          # BERT, DistilBERT or ELECTRA
    model = build_classifier(config, num_labels)            # inside strategy.scope()
    load_hf_weights(model, folder, keep_head=True)          # PyTorch-layout safetensors
    logits = model(features, training=True)                 # float32 [batch, num_labels]
    model.seed_dropout(seeded_dropout.DropoutSeeds(...))    # resumable dropout masks
    save_hf_checkpoint(model, labels, out)                  # loads in PyTorch transformers

`load_classifier` does the first three in one call.
"""
from __future__ import annotations

from pathlib import Path

from tasks.model.classifier import Classifier, build_classifier
from tasks.model.config import FAMILIES, EncoderConfig
from tasks.model.hf_weights import load_hf_weights, save_hf_checkpoint

__all__ = ["FAMILIES", "Classifier", "EncoderConfig", "build_classifier", "load_classifier",
           "load_hf_weights", "save_hf_checkpoint"]


def load_classifier(folder: Path | str, num_labels: int, *, keep_head: bool = True,
                    gelu: str | None = None, cpu_kernels: bool = False) -> Classifier:
    """The classifier of the checkpoint in `folder` (config.json, model.safetensors), its
    head kept where `keep_head` and the checkpoint has one of this size. Call inside
    `strategy.scope()`."""
    model = build_classifier(EncoderConfig.from_pretrained(folder), num_labels, gelu=gelu,
                             cpu_kernels=cpu_kernels)
    load_hf_weights(model, folder, keep_head=keep_head)
    return model
