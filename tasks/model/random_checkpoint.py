"""A freshly initialised classifier saved as a Hugging Face checkpoint: the tests' tiny
models and the benchmarks' published shapes with RANDOM weights (no download here).

A module of its own: hf_weights sits below classifier (which loads weights through it), and
this needs both. Imports TensorFlow.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import tf_keras

from tasks.model.classifier import build_classifier
from tasks.model.config import EncoderConfig
from tasks.model.hf_weights import save_hf_checkpoint


def save_random_classifier(raw: dict, seed: int, labels: Sequence[str],
                           folder: Path | str) -> Path:
    """`folder`: config.json and model.safetensors of bertflow's sequence classifier of
    config.json `raw` with one output per label, its weights drawn from `seed`."""
    tf_keras.utils.set_random_seed(seed)
    model = build_classifier(EncoderConfig.from_dict(raw), len(labels))
    save_hf_checkpoint(model, list(labels), folder)
    return Path(folder)
