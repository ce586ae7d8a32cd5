"""The tokenize step's side of `long_text: window`: each text becomes its windows' records
(tasks/model/windows.py, the rule the SavedModel applies too), every window with the text's
label and the text's index in its split (`text_id`), so that evaluation can put a text's
windows back together. The manifest's split entries count texts (`num_examples`, as the
data step does), records (`num_records`, what training reads per epoch) and the texts that
needed more than one window (`num_windowed`).
"""
from __future__ import annotations

from operator import attrgetter

import numpy as np
import tensorflow as tf

from tasks.model import windows
from tasks.steps.prepared import PreparedRow


class WindowCodec:
    """Prepared rows of one text and a label -> the records of their windows: (flat ids,
    window lengths, flat types, each text's length in pieces with [CLS]/[SEP], the labels
    repeated per window, each window's text index within the chunk)."""

    row_type = PreparedRow

    def __init__(self, encoder, stride: int, record_labels):
        self.encoder, self.stride, self.record_labels = encoder, stride, record_labels

    def encode(self, rows: list) -> tuple:
        texts = tf.constant(list(map(attrgetter("text"), rows)), tf.string)
        ids, types, text, lengths = windows.encode_windows(self.encoder, texts, self.stride)
        labels = self.record_labels(list(map(attrgetter("label"), rows)))
        text = text.numpy()
        return (ids.flat_values.numpy(), ids.row_lengths().numpy(), types.flat_values.numpy(),
                lengths.numpy(), np.take(labels, text, axis=0), text)


def window_spec(kind) -> dict:
    """The label_spec keys of windowed records: a `text_id`; token classification's also
    hold the window's place in its text (`text_id` = [text, window]), which puts a
    sentence's words back in order when they are scored."""
    return {"text_id": True, **({"window_index": True} if kind.per_token else {})}


def split_counts(entry: dict, records: int) -> dict:
    """A split's manifest entry of windowed records: nothing is cut, so the texts over
    max_seq_length (`num_truncated` of truncation) are the windowed ones."""
    return {**entry, "num_truncated": 0, "num_windowed": entry["num_truncated"],
            "num_records": records}


def records_of(split: dict) -> int:
    """Records of a tokenize manifest's split entry: its windows, or one per text."""
    return split.get("num_records", split["num_examples"])
