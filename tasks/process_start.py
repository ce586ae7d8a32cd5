"""How a `python -m tasks` process (or the warm-start server) imports a step's modules.

TensorFlow's and Keras' modules are hundreds of thousands of objects that are never garbage,
yet while they import they set off Python's full collections, each of which scans all of
them, and every full collection during the step scans them again. In cold 20-step SNIPS
runs (`benchmarks/quality.py --datasets snips --max-steps 20 --bertflow-start cold`, 3 runs
per version alternating, by hand with gc callbacks; no results file) the train step and
tokenize spent a sizeable share of their walls in the collector, and with the imports below
next to none. Importing the train step leaves unreachable objects that a collection would
take time to find: they are kept.
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
