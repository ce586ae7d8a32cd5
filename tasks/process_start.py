"""How a `python -m tasks` process (or the warm-start server) imports a step's modules.

TensorFlow's and Keras' modules are hundreds of thousands of objects that are never garbage,
yet while they import they set off Python's full collections, each of which scans all of
them, and every full collection during the step scans them again. In cold 20-step SNIPS
runs (`benchmarks/quality.py --datasets snips --max-steps 20 --bertflow-start cold`, 3 runs
per version alternating, by hand with gc callbacks) the train step spent 0.44-0.49 s in the
collector and tokenize 0.31-0.36 s; with the imports below, 0.03 s and 0.01 s. The steps'
walls went from 7.83 to 7.11 s (train) and 1.80 to 1.41 s (tokenize), medians. Importing the
train step leaves about 1,300 unreachable objects, which a collection would take 0.13 s to
find: they are kept.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def imports_out_of_collection() -> Iterator[None]:
    """No garbage collection inside; on leaving, every object made so far is moved out of
    the collector's sight (gc.freeze) and collection resumes."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
