"""What Airflow's DAG processor pays per parse of each file of dags/, with the Params' schemas as
shipped (naming JSON Schema draft 7) and without the draft, alternating in one invocation.

Airflow 3.3's Param.resolve calls jsonschema.validate, which checks the schema against its
draft's meta-schema on every call; with no "$schema" that is the newest draft, 2020-12
(tasks/params_form.py, DRAFT). DagSerialization.to_dict resolves every Param twice per task
(it compares each task's ParamsDict with a default, then casts it to str), and the processor
serializes every DAG of a file on every parse of it.

Each measurement is one parse of one file in a process forked for it from a worker holding
what the processor's manager holds (benchmarks/workers/_bertflow_dag_parse_worker.py): a
parse in the same process twice would find the file's imports (bertflow_airflow, parts of
tasks/) and jsonschema's validators cached, and favour whichever side ran second. `parse_s`
is BundleDagBag on the file, `serialize_s` DagSerialization.to_dict of its DAGs, `resolve_s`
one more Param.resolve of each of their Params after that (a resolve's steady cost), each in
wall and CPU seconds of the child. "no_draft" is the same DAGs with "$schema" removed from
every Param's schema, as before commit 598c71f.
Params, tasks and Param.resolve calls per DAG come from one untimed pass per side, the
resolve calls counted by wrapping it. What is computed rather than measured: the ratios (none
for a file without Params: its two sides are the same DAGs), the CPU per resolve (`resolve_s`
over the Params) and the extra cost per resolve of a serialization (the difference of its
medians over its resolve calls).

    ./.venv/bin/python benchmarks/dag_parse.py [--repeats 5] [--smoke]

`--smoke`: one run per side of a two-Param, two-task DAG written for it (SMOKE_DAG: no
bertflow import, so the run costs about Airflow's import), results in a temporary folder
(common.smoke_results_dir): the harness, not a figure.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lib import common
from lib.common import PROJECT_ROOT, alternate, median, write_results

WORKER = common.BENCH_DIR / "workers" / "_bertflow_dag_parse_worker.py"
DAGS = PROJECT_ROOT / "dags"
SIDES = ("as_shipped", "no_draft")
# --smoke's DAG file: one Param naming draft 7 as tasks/params_form.py's do, one naming none.
SMOKE_DAG = """
from datetime import datetime
from airflow.sdk import Param, dag, task

@dag(dag_id="dag_parse_smoke", schedule=None, start_date=datetime(2024, 1, 1),
     params={"epochs": Param(3, type="integer", minimum=1,
                             **{"$schema": "http://json-schema.org/draft-07/schema#"}),
             "name": Param("x", type="string")})
def dag_parse_smoke():
    task(lambda: None, task_id="a")() >> task(lambda: None, task_id="b")()

dag_parse_smoke()
"""


class Worker:
    """The worker process: one request per call, each parse in a child forked for it."""

    def __init__(self, airflow_home: Path, log: Path):
        env = {**os.environ, "AIRFLOW_HOME": str(airflow_home),
               "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
               "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
               "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "TF_USE_LEGACY_KERAS": "1",
               # this checkout's tasks/ and bertflow_airflow/, whatever the venv points at
               "PYTHONPATH": os.pathsep.join(
                   p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.log, self.stderr = log, log.open("w")
        self.proc = subprocess.Popen([sys.executable, str(WORKER)], cwd=PROJECT_ROOT,
                                     env=common.worker_env(env), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr)
        self._read("READY")

    def _read(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        raise RuntimeError(f"the worker ended ({self.proc.wait()}):\n"
                           + self.log.read_text()[-3000:])

    def __call__(self, dag_file: Path, variant: str, count: bool = False) -> dict:
        self.proc.stdin.write(json.dumps({"file": str(dag_file), "variant": variant,
                                          "count": count}) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self._read("RESULT "))
        if "error" in out:
            raise RuntimeError(f"{dag_file.name} ({variant}): {out['error']}")
        return out

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the worker's loop ends at the end of its input
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=60)
        self.stderr.close()


def counts(worker: Worker, dag_file: Path) -> dict:
    """Params, tasks and Param.resolve calls per DAG, from one untimed pass per side; the
    sides must agree on all but the Params carrying "$schema"."""
    seen = {side: worker(dag_file, side, count=True) for side in SIDES}
    keys = ("params", "tasks", "resolves")
    shipped, bare = (seen[s]["dags"] for s in SIDES)
    if {d: [v[k] for k in keys] for d, v in shipped.items()} != {
            d: [v[k] for k in keys] for d, v in bare.items()}:
        raise RuntimeError(f"{dag_file.name}: the sides differ in more than the draft: {seen}")
    if any(v["params_with_schema_key"] for v in bare.values()):
        raise RuntimeError(f"{dag_file.name}: a Param kept its $schema without the draft")
    return {"parse_resolves": seen["as_shipped"]["parse_resolves"],
            "dags": {d: {k: v[k] for k in (*keys, "params_with_schema_key")}
                     for d, v in shipped.items()}}


def measure_file(worker: Worker, dag_file: Path, repeats: int) -> dict:
    """Both sides, alternating; per run the child's figures, then medians and ratios."""
    load = os.getloadavg()
    facts = counts(worker, dag_file)
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}

    def once(side: str) -> float:  # alternate() takes one figure: parse + serialize, ms
        out = worker(dag_file, side)
        run = {"parse_s": out["parse_s"], "parse_cpu_s": out["parse_cpu_s"],
               "serialize_s": sum(d["serialize_s"] for d in out["dags"].values()),
               "serialize_cpu_s": sum(d["serialize_cpu_s"] for d in out["dags"].values()),
               "resolve_s": out["resolve_s"], "resolve_cpu_s": out["resolve_cpu_s"]}
        runs[side].append(run)
        return 1000 * (run["parse_s"] + run["serialize_s"])

    alternate({side: (lambda s=side: once(s)) for side in SIDES}, repeats)
    fields = ("parse_s", "parse_cpu_s", "serialize_s", "serialize_cpu_s", "resolve_s",
              "resolve_cpu_s")
    medians = {side: {f"median_{f}": median([r[f] for r in runs[side]]) for f in fields}
               for side in SIDES}
    for side in SIDES:
        m = medians[side]
        m["median_total_s"] = median([r["parse_s"] + r["serialize_s"] for r in runs[side]])
    shipped, bare = medians["as_shipped"], medians["no_draft"]
    resolves = sum(d["resolves"] for d in facts["dags"].values())
    params = sum(d["params"] for d in facts["dags"].values())
    computed = {f"no_draft_over_as_shipped_{k}": bare[f"median_{k}"] / shipped[f"median_{k}"]
                if params else None for k in (*fields, "total_s")}
    for side in SIDES:  # the steady cost of one resolve: the Params' resolve time over them
        computed[f"cpu_ms_per_resolve_{side}"] = (
            1000 * medians[side]["median_resolve_cpu_s"] / params if params else None)
    for name, k in (("extra_ms_per_resolve_without_draft", "serialize_s"),
                    ("extra_cpu_ms_per_resolve_without_draft", "serialize_cpu_s")):
        computed[name] = (1000 * (bare[f"median_{k}"] - shipped[f"median_{k}"]) / resolves
                          if resolves else None)
    return {**facts, "load_avg_at_start": load, "runs": runs, "medians": medians,
            "computed": computed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true",
                        help="one run per side of a tiny DAG, results in a temporary folder")
    args = parser.parse_args()
    files = sorted(p for p in DAGS.glob("*.py") if not p.name.startswith("_"))
    work = Path(tempfile.mkdtemp(prefix="dag-parse-"))
    if args.smoke:
        common.smoke_results_dir()
        files = [work / "dags" / "dag_parse_smoke.py"]
        files[0].parent.mkdir()
        files[0].write_text(SMOKE_DAG)
        args.repeats = 1
    results = {"repeats": args.repeats, "smoke": args.smoke,
               "versions": {name: importlib.metadata.version(name)
                            for name in ("apache-airflow", "jsonschema")},
               "files": {}}
    worker = Worker(work / "airflow_home", work / "worker.log")
    try:
        for dag_file in files:
            print(f"{dag_file.name} (parse + serialize, ms):")
            row = measure_file(worker, dag_file, args.repeats)
            results["files"][dag_file.name] = row
            shipped, bare = row["medians"]["as_shipped"], row["medians"]["no_draft"]
            ratio = row["computed"]["no_draft_over_as_shipped_serialize_s"]
            print(f"  serialize {shipped['median_serialize_s']:.2f} s as shipped, "
                  f"{bare['median_serialize_s']:.2f} s without the draft"
                  + (f" ({ratio:.2f}x)" if ratio else " (no Params)")
                  + f"; parse {shipped['median_parse_s']:.2f} s, {bare['median_parse_s']:.2f} s")
    finally:
        worker.close()
        shutil.rmtree(work, ignore_errors=True)
    results["load_avg_at_end"] = os.getloadavg()
    write_results("dag_parse", results)


if __name__ == "__main__":
    main()
