"""The `deterministic` Param (RunConfig.deterministic): two runs with one seed end with
bitwise-equal weights, and so does a run preempted and resumed (docs/preemption.md,
"Reproducible runs").

What makes a run differ from its twin, and what takes care of each:

- bertflow's LayerNorm gradient kernel (tasks/model/cpu_kernels/layer_norm.cc) added each
  thread's share of dgamma and dbeta into the result as the threads finished, in an order
  that varied from call to call: the cause of issue 34's two BANKING77 runs ending at 0.4149
  and 0.4166. Fixed for every run, flag or not: per-block sums added in block order, the
  same bits for any thread count. The other kernels (GELU, dropout, AdamW) never combine
  threads' results, so the flag keeps the kernels on.
- TensorFlow ops that use threads in a nondeterministic way (segment sums, scatters, mostly
  GPU kernels): `tf.config.experimental.enable_op_determinism()`, before the worker runs any
  op; such ops then take a deterministic algorithm or raise UnimplementedError.
- tf.data's parallel map and interleave: pinned to `deterministic=True` in
  tasks/training/inputs.py (tf.data's default; exact resume relies on it). Op determinism
  also keeps tf.data from reordering.
- Random draws were seeded already: file order, shuffle buffer and length-grouped windows
  from `seed`; dropout masks stateless (tasks/training/seeded_dropout.py); the head's initial
  weights from `seed` (tf_keras.utils.set_random_seed).

Not covered, flag or not: another machine kind (CPU instruction set: the kernels and oneDNN
pick code paths per CPU), another strategy, replica or worker count (the global batch is
summed across replicas in another order), parameter_server with several workers
(asynchronous updates), another TensorFlow build.
"""
from __future__ import annotations

import tensorflow as tf


def configure(cfg) -> bool:
    """Turn on op determinism when the run asks for it; call first in a worker, before any
    TensorFlow op runs. Returns whether it is on."""
    if not getattr(cfg, "deterministic", False):
        return False
    tf.config.experimental.enable_op_determinism()
    return True
