"""What a serving SavedModel keeps of a tokenizer: its resources (RoBERTa's lookup table) and
variables, which the serving graph reads, and not its own tf.functions, which no signature
calls.

tf.saved_model.save traces every tf.function of every object it tracks, so that the loaded
object can call it: a tracked encoder had its unused `encode_pair` (sequence tasks) and the
aligner's `align` and `align_max_context` (token tasks) traced, serialized and restored on
every load. The windowed token export of tests/test_token_windows.py spent ~20 s of its
~46 s of saves there (py-spy by hand, no results file)."""
from __future__ import annotations

import tensorflow as tf

_STATE = (tf.Variable, tf.saved_model.experimental.TrackableResource, tf.saved_model.Asset)


def resources(obj) -> list:
    """`obj`'s tracked variables, resources and assets (each with what it tracks itself, e.g. a
    table's initializer), for a serving module to track instead of `obj`."""
    return [t for t in tf.train.TrackableView(obj).descendants() if isinstance(t, _STATE)]
