"""Writes a safetensors file one tensor at a time; reading stays safetensors' own.

Why not `safetensors.numpy.save_file`: it takes every tensor at once, as bytes, so a model's
save holds each weight three times over (the variable's value, its PyTorch-layout copy, the
bytes) in memory the process touches for the first time. At BERT-base size the train
step's save, its only one, was slower that way than tensor by tensor (by hand, alternating
runs of benchmarks/train_fixed_cost.py; no results file holds the pair: the live
train_fixed_cost.json is after the change, archive/..._before_streamed_save.json before).

The format (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian
header length, a JSON header mapping each name to its dtype, shape and data_offsets (begin,
end, relative to the data that follows) plus "__metadata__" (strings only), padded with
spaces to a multiple of 8 bytes; then the tensors' bytes, C order, in offset order with no
gap. The file is written beside its destination and renamed into place, so a failed save
leaves no partial file.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

# The numpy dtypes bertflow writes, by their safetensors names.
DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
          np.dtype(np.int64): "I64", np.dtype(np.int32): "I32"}


class Tensor:
    """A tensor to write: its shape and dtype, known before its values, and a function that
    makes the values when their turn comes (so that only one is in memory at a time)."""

    def __init__(self, shape, dtype, make: Callable[[], np.ndarray]):
        self.shape, self.dtype, self.make = tuple(int(d) for d in shape), np.dtype(dtype), make
        if self.dtype not in DTYPES:
            raise ValueError(f"safetensors_stream writes {sorted(map(str, DTYPES))}, not "
                             f"{self.dtype}")

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def header(tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None) -> bytes:
    """The length-prefixed JSON header of `tensors`, written in name order."""
    entries: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        entries[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                         "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def save_file(tensors: Mapping[str, Tensor], path: Path | str,
              metadata: Mapping[str, str] | None = None) -> None:
    """Write `tensors` to `path`, making each one's values only when it is written."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as out:
            out.write(header(tensors, metadata))
            for name in sorted(tensors):
                t = tensors[name]
                values = t.make()
                if not values.flags.c_contiguous:
                    values = np.ascontiguousarray(values)
                if values.shape != t.shape or values.dtype != t.dtype:
                    raise ValueError(f"{path}: tensor {name!r} is {values.dtype} "
                                     f"{list(values.shape)}, its header says {t.dtype} "
                                     f"{list(t.shape)}")
                out.write(values.data)
                del values
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
