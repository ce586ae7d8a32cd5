"""Test-only virtual environments kept outside the checkout, keyed by what they install.

A fresh clone (as CI makes for every run) would otherwise build them again each time: the TPU
lock's TensorFlow 2.20 environment is ~2.4 GB downloaded from PyPI (measured: 95 s of CPU and
2.5 min on this 2-core machine; PyPI as reached here sends no cache headers, so pip's own cache
keeps nothing). An environment lives in $BERTFLOW_TEST_ENVS (default
~/.cache/bertflow/test-envs) under a name with the hash of everything that decides its
contents (the pins, the base interpreter), so a changed lock builds a new one and an unchanged
one is never rebuilt. Delete the folder to reclaim the space.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

DONE = ".bertflow-complete"


def root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bertflow"
    return Path(os.environ.get("BERTFLOW_TEST_ENVS", default / "test-envs"))


def venv(name: str, key: str, install: Callable[[Path], None]) -> Path:
    """The interpreter of environment `name` for `key`, made by `install(python)` in a fresh
    venv of this interpreter unless a complete one exists. Sessions running at once (several
    checkouts on one machine) wait for one build instead of racing it."""
    digest = hashlib.sha256(f"{key}\n{sys.version}\n{sys.base_prefix}".encode()).hexdigest()
    folder = root() / f"{name}-{digest[:16]}"
    python = folder / "bin" / "python"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # The marker is written last: a build that died half-way is started again.
        if not (folder / DONE).is_file() or not python.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
            install(python)
            (folder / DONE).write_text(key)
    return python
