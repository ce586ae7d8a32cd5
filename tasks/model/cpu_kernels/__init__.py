"""bertflow's CPU kernels: one-pass AdamW, dropout, GELU and LayerNorm as TensorFlow custom ops.

The stock TensorFlow wheel compiles its element-wise kernels for baseline x86-64 (no AVX2 or
AVX-512), and builds each of these operations from several ops, each a pass over memory. On a
2-core CPU that work, not the matrix multiplies, limited a MiniLM training step; these kernels
make training 1.47x-1.64x faster (computed from benchmarks/results/train_throughput.json and
train_throughput_sst2_epoch.json: summary.bertflow over summary.bertflow_no_kernels,
median_examples_per_s; benchmarks/RESULTS.md). Each hot loop is compiled for
AVX-512, AVX2 and baseline x86-64 and picked at load time, so one build serves any x86-64 CPU.

`make install` builds the library (`python -m tasks.model.cpu_kernels build`; needs g++).
Without it, or with BERTFLOW_CPU_KERNELS=0, training uses TensorFlow's own ops: same results
to float rounding, slower. The kernels run only on CPUs and only during training and evaluation:
`tasks.steps.export` writes SavedModels from stock ops, which need no library to serve.

Each kernel gives the same bits for the same input on every call and for any number of
threads: GELU, dropout and AdamW never combine threads' results (AdamW adds repeated
embedding rows in index order), and the LayerNorm gradient sums dgamma and dbeta over fixed
row blocks, added in block order. So the `deterministic` Param (tasks/training/determinism.py)
keeps the kernels on rather than falling back to TensorFlow's ops.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import tensorflow as tf

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
BUILD_DIR = SOURCE_DIR / "build"
SOURCES = sorted(SOURCE_DIR.glob("*.cc"))
CXXFLAGS = ["-std=c++17", "-shared", "-fPIC", "-O3", "-fno-math-errno", "-fopenmp-simd",
            "-Wno-deprecated-declarations"]


def library_path() -> Path:
    """Where the library for these sources and this TensorFlow lives: the name carries a hash
    of both, so a stale build is never loaded."""
    digest = hashlib.sha256(tf.__version__.encode())
    for path in [*SOURCES, SOURCE_DIR / "kernel_util.h"]:
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(" ".join(CXXFLAGS).encode())
    return BUILD_DIR / f"bertflow_cpu_kernels-{digest.hexdigest()[:16]}.so"


def build(cxx: str | None = None) -> Path:
    """Compile the library (about 30 s); a no-op when it is already built."""
    out = library_path()
    if out.exists():
        return out
    cxx = cxx or os.environ.get("CXX", "g++")
    if not shutil.which(cxx):
        raise RuntimeError(f"no C++ compiler ({cxx}) on PATH: install g++ (Debian: apt-get "
                           "install g++) and run `python -m tasks.model.cpu_kernels build`")
    BUILD_DIR.mkdir(exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    cmd = [cxx, *CXXFLAGS, *map(str, SOURCES), "-o", str(tmp), *tf.sysconfig.get_compile_flags(),
           *tf.sysconfig.get_link_flags()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building {out.name} failed:\n{proc.stderr[-4000:]}")
    tmp.replace(out)  # atomic: a concurrent loader sees the whole file or none
    for old in BUILD_DIR.glob("bertflow_cpu_kernels-*.so"):
        if old != out:
            old.unlink(missing_ok=True)
    return out


@functools.cache
def library():
    """The loaded op library, or None (not built, or switched off by BERTFLOW_CPU_KERNELS=0)."""
    if os.environ.get("BERTFLOW_CPU_KERNELS", "1") == "0":
        return None
    path = library_path()
    if not path.exists():
        log.warning("bertflow CPU kernels are not built (%s); training on CPU uses TensorFlow's "
                    "ops and is slower. Build them with `python -m tasks.model.cpu_kernels build`.",
                    path.name)
        return None
    return tf.load_op_library(str(path))


def available() -> bool:
    return library() is not None


def ops():
    lib = library()
    if lib is None:
        raise RuntimeError("bertflow CPU kernels are not loaded; check available() first")
    return lib


# Gradients, by op name (registering them needs no library).
@tf.RegisterGradient("BertflowGelu")
def _gelu_grad(op, dy):
    return ops().bertflow_gelu_grad(dy, op.inputs[0])


@tf.RegisterGradient("BertflowDropout")
def _dropout_grad(op, dy, _keep_grad):
    return ops().bertflow_dropout_grad(dy, op.outputs[1], op.inputs[2]), None, None


@tf.RegisterGradient("BertflowLayerNorm")
def _layer_norm_grad(op, dy, _mean_grad, _rstd_grad):
    return ops().bertflow_layer_norm_grad(dy, op.inputs[0], op.inputs[1], op.outputs[1],
                                          op.outputs[2])


def gelu(x: tf.Tensor) -> tf.Tensor:
    """Exact (erf) GELU, computed in float32, returned in x's dtype (float32 or bfloat16)."""
    return ops().bertflow_gelu(x)


def dropout(x: tf.Tensor, rate: float, seed: tf.Tensor | None = None) -> tf.Tensor:
    """Inverted dropout: zero each element with probability `rate`, scale the rest by
    1/(1-rate). The mask is a function of `seed` (int64 [2]; tasks/training/seeded_dropout.py
    derives it from the training step). Without one, the pair comes from TensorFlow's stateful
    RNG, so a global seed (tf_keras.utils.set_random_seed) makes the masks reproducible within
    a process."""
    if seed is None:
        seed = tf.random.uniform([2], maxval=2**62, dtype=tf.int64)
    return ops().bertflow_dropout(x, seed, tf.constant(rate, tf.float32))[0]


def layer_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: float) -> tf.Tensor:
    """Normalise over the last axis (statistics in float32), then scale and shift."""
    return ops().bertflow_layer_norm(x, gamma, beta, epsilon=epsilon)[0]


def apply_adamw(var, m, v, grad, coefficients, grad_scale, indices=None):
    """One AdamW step on `var` and its moments; `coefficients` is
    [lr_t, 1-beta1, 1-beta2, epsilon, lr*weight_decay], and the gradient is multiplied by the
    scalar `grad_scale` first (a clipping factor, or 1). With `indices`, grad holds those rows
    (repeats are summed) and every other row takes the zero-gradient update."""
    sparse = indices is not None
    if indices is None:
        indices = tf.zeros([0], tf.int32)
    return ops().bertflow_apply_adam_w(var.handle, m.handle, v.handle, grad,
                                       tf.cast(indices, tf.int32), coefficients, grad_scale,
                                       sparse=sparse)


def main(argv: list[str]) -> int:
    if argv[1:] != ["build"]:
        print("usage: python -m tasks.model.cpu_kernels build", file=sys.stderr)
        return 2
    try:
        print(f"built {build()}")
    except RuntimeError as e:
        print(f"bertflow CPU kernels: {e}", file=sys.stderr)
        return 1
    return 0
