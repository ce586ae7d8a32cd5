"""Resolving the trainer locks on PyPI (tests/test_images.py), started early.

pip's dry-run resolution of the three locks waits on the network for over a minute (it reads
the metadata of ~500 wheels with range requests) using a third of a core. conftest.py starts
it when collection shows the session will run it, so it overlaps the CPU-bound tests
collected before tests/test_images.py; the test then only collects the results.
"""
from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from tasks.provision import images

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bertflow_lock_resolve",
                                               ROOT / "docker" / "locks" / "resolve.py")
resolve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resolve)

TEST_NAME = "test_lock_resolves_on_pypi_to_exactly_its_pins"
_started: dict[str, tuple] = {}
_workdir: Path | None = None


def start() -> dict[str, tuple]:
    """(pip process, work folder) per image kind; started once per session."""
    global _workdir
    if not _started:
        resolve.check_registry()  # RegistryError: the test reports it
        _workdir = Path(tempfile.mkdtemp(prefix="bertflow-locks-"))
        for kind in images.KINDS:
            _started[kind] = (resolve.start_check(ROOT / images.LOCKS[kind],
                                                  _workdir / kind), _workdir / kind)
    return _started


def stop() -> None:
    for proc, _ in _started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if _workdir is not None:
        shutil.rmtree(_workdir, ignore_errors=True)
