"""benchmarks/dag_parse.py's worker: DAG files parsed and their DAGs serialized as Airflow's DAG
processor does it, each in a process forked for it, as the processor forks one per parse.

    PYTHONPATH=benchmarks ./.venv/bin/python benchmarks/workers/_bertflow_dag_parse_worker.py

One request per stdin line, `{"file": DAG_FILE, "variant": "as_shipped"|"no_draft", "count":
bool}`, one `RESULT {json}` line per request on stdout. This process holds what the
processor's manager holds before it forks (dag_processing/processor.py): the processor module,
the plugins (loaded as its Job starts), then the Airflow modules the file imports
(_pre_import_airflow_modules). The forked child times BundleDagBag on the file (`parse_s`:
the file's own imports the plugins did not make, the DAGs' construction) and
DagSerialization.to_dict of each DAG (`serialize_s`), then one Param.resolve of each of
their Params (`resolve_s`). Wall seconds, and the child's CPU seconds (`*_cpu_s`). A child
imports nothing another child imported: each parse starts from the same modules, as the
processor's do.

`no_draft` removes "$schema" from every Param's schema as the Param is made: the DAGs as they
were before their Params named draft 7. `count` wraps Param.resolve with a counter instead of
timing: the calls of the parse and of each serialization (its timings are not figures)."""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

SCHEMA_KEY = "$schema"


def _wrap_init(param_cls, strip: bool) -> None:
    """With `strip`, every Param made from here on has no "$schema" in its schema. Both sides
    wrap (and look), so that the wrapper's cost is no difference between them."""
    init = param_cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if isinstance(self.schema, dict) and SCHEMA_KEY in self.schema and strip:
            self.schema = {k: v for k, v in self.schema.items() if k != SCHEMA_KEY}

    param_cls.__init__ = __init__


def _counting(param_cls) -> list[int]:
    """A one-item list counting Param.resolve's calls."""
    calls = [0]
    resolve = param_cls.resolve

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return resolve(self, *args, **kwargs)

    param_cls.resolve = counted
    return calls


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clocks()
    return wall - start[0], cpu - start[1]


def measure(dag_file: str, variant: str, count: bool) -> dict:
    """One parse and serialization of `dag_file` in this (forked) process."""
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.sdk.definitions.param import Param
    from airflow.serialization.serialized_objects import DagSerialization

    _wrap_init(Param, strip=variant == "no_draft")
    calls = _counting(Param) if count else [0]
    start = _clocks()
    bag = BundleDagBag(dag_folder=dag_file, bundle_path=Path(dag_file).parent,
                       bundle_name="dags-folder", load_op_links=False)
    parse_s, parse_cpu_s = _since(start)
    if bag.import_errors or not bag.dags:
        raise RuntimeError(f"{dag_file}: no DAG or import errors: {bag.import_errors}")
    parse_resolves = calls[0]
    dags = {}
    for dag_id, dag in sorted(bag.dags.items()):
        before, start = calls[0], _clocks()
        DagSerialization.to_dict(dag)
        serialize_s, serialize_cpu_s = _since(start)
        params = [dag.params.get_param(k) for k in dag.params]
        dags[dag_id] = {"serialize_s": serialize_s, "serialize_cpu_s": serialize_cpu_s,
                        "params": len(params), "tasks": len(dag.tasks),
                        "params_with_schema_key": sum(SCHEMA_KEY in p.schema for p in params),
                        "resolves": calls[0] - before if count else None}
    # Then each Param once more, alone: a resolve's steady cost (jsonschema's caches warm)
    params = [d.params.get_param(k) for d in bag.dags.values() for k in d.params]
    start = _clocks()
    for param in params:
        param.resolve(suppress_exception=True)
    resolve_s, resolve_cpu_s = _since(start)
    return {"parse_s": parse_s, "parse_cpu_s": parse_cpu_s,
            "parse_resolves": parse_resolves if count else None, "dags": dags,
            "resolve_s": resolve_s, "resolve_cpu_s": resolve_cpu_s}


def forked(request: dict) -> dict:
    """measure() in a child forked from this process; its result or its error."""
    from airflow.utils.file import iter_airflow_imports

    for module in iter_airflow_imports(request["file"]):  # as _pre_import_airflow_modules
        importlib.import_module(module)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            out = measure(request["file"], request["variant"], request["count"])
        except BaseException:  # noqa: BLE001  (the parent reports it)
            out = {"error": traceback.format_exc()}
        with os.fdopen(write, "w") as pipe:
            pipe.write(json.dumps(out))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        return {"error": f"the child ended with status {status} and no result"}
    return json.loads(text)


def main() -> None:
    from airflow.dag_processing import processor  # noqa: F401  (the manager holds it)
    from airflow.listeners.listener import get_listener_manager

    # The processor's Job calls this as it starts (jobs/job.py), which loads the plugins (ours
    # registers the timetables; its UI imports part of tasks/): its children find them loaded.
    get_listener_manager()

    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip():
            print("RESULT " + json.dumps(forked(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
