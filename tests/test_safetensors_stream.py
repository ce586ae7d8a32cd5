"""tasks/model/safetensors_stream.py: files that safetensors itself reads back as written."""
from __future__ import annotations

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from tasks.model import safetensors_stream
from tasks.model.safetensors_stream import Tensor


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"encoder.layer.0.weight": rng.normal(size=(7, 5)).astype(np.float32),
            "a.bias": rng.normal(size=(5,)).astype(np.float32),
            "half": rng.normal(size=(3, 2, 2)).astype(np.float16),  # 24 bytes: offsets move
            "ids": np.arange(6, dtype=np.int64).reshape(2, 3),
            "count": np.array(3, np.int32),  # a scalar
            "empty": np.zeros((0, 4), np.float32)}


def _tensors(arrays) -> dict[str, Tensor]:
    return {k: Tensor(v.shape, v.dtype, lambda v=v: v) for k, v in arrays.items()}


def test_safetensors_reads_back_every_tensor_and_the_metadata(tmp_path):
    arrays = _arrays()
    path = tmp_path / "model.safetensors"
    safetensors_stream.save_file(_tensors(arrays), path, metadata={"format": "pt"})
    loaded = load_file(str(path))
    assert loaded.keys() == arrays.keys()
    for name, value in arrays.items():
        assert loaded[name].dtype == value.dtype and loaded[name].shape == value.shape, name
        np.testing.assert_array_equal(loaded[name], value)
    with safe_open(str(path), "np") as f:
        assert f.metadata() == {"format": "pt"}


def test_values_are_made_one_at_a_time_in_name_order(tmp_path):
    made = []
    arrays = _arrays()
    tensors = {k: Tensor(v.shape, v.dtype, lambda k=k, v=v: made.append(k) or v)
               for k, v in arrays.items()}
    safetensors_stream.save_file(tensors, tmp_path / "m.safetensors")
    assert made == sorted(arrays)


def test_a_transposed_view_is_written_in_c_order(tmp_path):
    kernel = np.arange(6, dtype=np.float32).reshape(2, 3)
    safetensors_stream.save_file({"w": Tensor((3, 2), np.float32, lambda: kernel.T)},
                                 tmp_path / "m.safetensors")
    np.testing.assert_array_equal(load_file(str(tmp_path / "m.safetensors"))["w"], kernel.T)


def test_a_tensor_unlike_its_header_fails_naming_it_and_leaves_no_file(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"the previous model")
    tensors = {"good": Tensor((2,), np.float32, lambda: np.zeros(2, np.float32)),
               "wrong": Tensor((2, 2), np.float32, lambda: np.zeros((2, 3), np.float32))}
    with pytest.raises(ValueError, match=r"tensor 'wrong' is float32 \[2, 3\], its header "
                                         r"says float32 \[2, 2\]"):
        safetensors_stream.save_file(tensors, path)
    assert path.read_bytes() == b"the previous model"  # what was there is kept
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


def test_a_dtype_it_does_not_write_is_refused_before_anything_is_written():
    with pytest.raises(ValueError, match="not float64"):
        Tensor((2,), np.float64, lambda: np.zeros(2))
