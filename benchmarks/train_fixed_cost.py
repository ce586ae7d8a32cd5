"""The train step's fixed cost at BERT-base size (issue 35: under 10 s): what a run pays once,
whatever its number of steps (process start and imports, model build and checkpoint load,
the first step's tracing, the final saves, exit).

    ./.venv/bin/python benchmarks/train_fixed_cost.py [--short 5] [--long 25] [--repeats 3]
        [--smoke]

The model is BERT-base's shape with RANDOM weights (synthetic_inputs.write_random_checkpoint:
no BERT-base weights ship in any package reachable offline; the cost depends on shapes only),
batch 32 of synthetic rows longer than max_seq_length 128, so every step is a full [32, 128]
batch. Each run is `python -m tasks train --run-dir RUN` through LocalCluster, in a fresh
interpreter as a remote worker starts it (`--start cold`, the default) or forked from the
warm-start server as local runs start it (`--start warm`), with the default config (fit,
mixed_precision auto, no checkpoint before the end) but for `evaluate_in_train` off (the
evaluation is the evaluate step's work; quality.py times it);
the data and tokenize steps run once before, untimed. Runs of --short and --long steps
alternate.

Per run, measured: the process's wall time, and from the run's own records the goodput parts
(tasks/training/goodput_clock.py: start-up = process start to the first step, checkpoint =
the saves, here the model's at the end: no periodic checkpoint falls in these runs) and the
step times (train/history.json's elapsed seconds per step: the first step includes
tf.function tracing); `exit_s` is from the record's last write to the process's end, and
`other_s` the rest of the process's time (between the last step and the model's save). Derived:
- `fixed_s` per run: wall - steps x the run's median steady step (measured parts, computed
  sum);
- `intercept_s`: the line through the medians of the two step counts' walls at 0 steps
  (computed from measured walls; the issue's "about 15 s" came this way).

`--smoke`: a tiny random BERT, 2 and 4 steps, one repeat, results in a temporary folder;
with `--start warm` its runs fork from the server $BERTFLOW_WARM_SOCKET names when one serves
(the test session's: common.warm_server's `reuse`; warm_server_ready_s is then null).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from lib import common
from lib import synthetic_inputs
from lib.common import median

BATCH, SEQ = 32, 128


def prepare(work: Path, shape_name: str, rows: int, steps: dict[str, int],
            warm_socket: Path | None = None) -> dict[str, Path]:
    """The random checkpoint, a TSV of long rows, and one run folder per step count with its
    data and tokenize steps done (the tokenized shards are shared through the cache), started
    as the train steps are (`--start`)."""
    vocab = synthetic_inputs.vocab_file()
    model_dir = synthetic_inputs.write_random_checkpoint(synthetic_inputs.MODELS[shape_name],
                                                         work / "model", vocab)
    batches = json.loads(synthetic_inputs.write_batches(
        vocab, SEQ, BATCH, -(-rows // BATCH), work / "batches.json").read_text())["batches"]
    tsv = work / "rows.tsv"
    with open(tsv, "w", encoding="utf-8") as f:
        f.write("text\tlabel\n")
        for batch in batches:
            f.writelines(f"{t}\t{y}\n" for t, y in zip(batch["texts"], batch["labels"]))
    runs = {}
    for name, n in steps.items():
        run_dir = work / "art" / "runs" / "fixed_cost" / name
        cfg = {"train_uri": str(tsv), "eval_uri": str(tsv), "artifact_root": str(work / "art"),
               "base_model": str(model_dir), "per_replica_batch_size": BATCH,
               "max_seq_length": SEQ, "epochs": 1, "max_steps": n,
               "checkpoint_every_steps": 100_000,
               # The step's fixed cost as issue 35 counts it; the evaluation it runs by
               # default is the evaluate step's work, timed by quality.py.
               "evaluate_in_train": False}
        cfg_file = work / f"{name}.json"
        cfg_file.write_text(json.dumps(cfg))
        common.tasks_cli("init-run", "--run-dir", str(run_dir), "--config", str(cfg_file))
        for step in ("data", "tokenize"):
            common.run_step(step, run_dir, warm_socket)
        runs[name] = run_dir
    return runs


def train_once(run_dir: Path, warm_socket: Path | None) -> dict:
    """One `python -m tasks train` through LocalCluster (common.run_step); its wall time and
    its own records."""
    shutil.rmtree(run_dir / "train", ignore_errors=True)  # from the base model each time
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    common.run_step("train", run_dir, warm_socket)
    wall = time.perf_counter() - t0
    [parts_file] = (run_dir / "train" / "goodput").glob("attempt-1-*.json")
    parts = json.loads(parts_file.read_text())
    records = json.loads((run_dir / "train" / "history.json").read_text())["records"]
    elapsed = [r["elapsed_seconds"] for r in records]
    if [r["step"] for r in records] != list(range(1, len(records) + 1)):
        raise RuntimeError("history.json skipped steps: too many steps for per-step times")
    steady = [b - a for a, b in zip(elapsed[1:], elapsed[2:])]  # steps 3.. (2: warm caches)
    steady_s = median(steady) if steady else elapsed[-1] - elapsed[0]
    steps = parts["steps"]
    in_process = parts["written_at"] - parts["started_at"]
    return {"steps": steps, "wall_s": wall, "load_avg_1min_before": load,
            "startup_s": parts["startup_s"], "first_step_s": elapsed[0],
            "median_steady_step_s": steady_s, "checkpoint_s": parts["checkpoint_s"],
            "productive_s": parts["productive_s"],
            # the rest: after the goodput record's last write (the saves) to the exit
            "exit_s": wall - in_process,
            # in the process but in no part: between the last step and the model's save
            "other_s": in_process - parts["startup_s"] - parts["productive_s"]
            - parts["checkpoint_s"],
            "fixed_s": wall - steps * steady_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", type=int, default=5)
    ap.add_argument("--long", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--start", choices=("cold", "warm"), default="cold",
                    help="each run a fresh interpreter, as a remote worker starts (default), "
                         "or forked from a warm-start server, as local runs under `make "
                         "airflow` start (the server starts once, before the runs)")
    ap.add_argument("--name", default="train_fixed_cost", help="results file name")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    shape = "bert-base"
    if args.smoke:
        common.smoke_results_dir()
        shape, args.short, args.long, args.repeats = "tiny", 2, 4, 1
    steps = {"short": args.short, "long": args.long}
    with tempfile.TemporaryDirectory(prefix="train-fixed-cost-") as tmp, \
            common.warm_server(args.start == "warm", Path(tmp) / "warm.log",
                               reuse=args.smoke) as (socket, server_s):
        runs_dirs = prepare(Path(tmp), shape, BATCH * args.long, steps, socket)
        runs: dict[str, list[dict]] = {name: [] for name in steps}

        def side(name):
            def once() -> float:
                run = train_once(runs_dirs[name], socket)
                runs[name].append(run)
                return run["wall_s"]
            return once

        common.alternate({name: side(name) for name in steps}, args.repeats)
    walls = {name: median([r["wall_s"] for r in runs[name]]) for name in steps}
    slope = (walls["long"] - walls["short"]) / (args.long - args.short)
    summary = {name: {key: median([r[key] for r in runs[name]])
                      for key in ("wall_s", "startup_s", "first_step_s", "median_steady_step_s",
                                  "checkpoint_s", "exit_s", "other_s", "fixed_s")}
               for name in steps}
    results = {"smoke": args.smoke, "start": args.start, "warm_server_ready_s": server_s,
               "shape": shape,
               "model": dataclasses.asdict(synthetic_inputs.MODELS[shape]),
               "batch_size": BATCH,
               "max_seq_length": SEQ, "steps": steps, "repeats": args.repeats, "runs": runs,
               "summary": summary,
               "computed_slope_s_per_step": slope,
               "computed_intercept_s": walls["short"] - args.short * slope,
               "target_fixed_s": 10.0}
    for name in steps:
        s = summary[name]
        print(f"{name} ({steps[name]} steps): wall {s['wall_s']:.1f} s = start-up "
              f"{s['startup_s']:.1f} + first step {s['first_step_s']:.1f} + steady "
              f"{s['median_steady_step_s']:.2f}/step + saves {s['checkpoint_s']:.1f} + other "
              f"{s['other_s']:.1f} + exit {s['exit_s']:.1f}; fixed {s['fixed_s']:.1f} s")
    print(f"intercept (computed from the median walls): {results['computed_intercept_s']:.1f} s;"
          f" slope {slope:.2f} s/step")
    common.write_results(args.name, results)


if __name__ == "__main__":
    main()
