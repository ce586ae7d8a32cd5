"""How a `python -m tasks` process ends: as the interpreter would, less its teardown.

`finish()` does what interpreter exit does that a step's results depend on: join the
non-daemon threads, run the atexit handlers, flush stdout and stderr. The caller then ends
with os._exit. What that skips is the teardown of module globals and TensorFlow's static
destructors, which writes nothing and took a noticeable part of every step process (the
first run of benchmarks/train_fixed_cost.py, before this; its file was not kept; `exit_s`
is 0.4 s in benchmarks/results/train_fixed_cost.json, `summary.*.exit_s`). Steps forked by the
warm-start server
(tasks/provision/local/warm_start.py) have always ended this way.
"""
from __future__ import annotations

import atexit
import contextlib
import sys
import threading


def finish() -> None:
    threading._shutdown()  # noqa: SLF001  (as interpreter exit: join non-daemon threads)
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):
            stream.flush()
