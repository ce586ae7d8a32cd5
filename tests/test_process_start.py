"""tasks/process_start.py: a step's imports with no garbage collection, then frozen."""
from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from tasks import process_start

# Imports the tokenize step (TensorFlow, tensorflow-text) in a fresh interpreter and prints
# how many full collections ran during the import and whether collection is on afterwards.
COUNT = r"""
import gc, importlib, json, sys
full = []
gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2
                    and full.append(1))
from tasks import process_start
if sys.argv[1] == "with":
    with process_start.imports_out_of_collection():
        importlib.import_module("tasks.steps.tokenize")
else:
    importlib.import_module("tasks.steps.tokenize")
print(json.dumps({"full": len(full), "enabled": gc.isenabled(),
                  "frozen": gc.get_freeze_count()}))
"""


def _imported(how: str) -> dict:
    out = subprocess.run([sys.executable, "-c", COUNT, how], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_a_step_import_runs_no_full_collection_and_leaves_its_objects_frozen():
    plain, frozen = _imported("without"), _imported("with")
    assert plain["full"] > 0, plain  # what the context manager takes away
    assert frozen["full"] == 0 and frozen["enabled"], frozen
    # the imported modules' objects are out of the collector's sight
    assert frozen["frozen"] > 100_000 and plain["frozen"] == 0, (plain, frozen)


def test_collection_resumes_when_the_import_fails():
    try:
        with pytest.raises(ModuleNotFoundError):
            with process_start.imports_out_of_collection():
                assert not gc.isenabled()
                import tasks.no_such_step  # noqa: F401
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # this test process's objects go back to the collector
        gc.enable()
