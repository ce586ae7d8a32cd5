"""Early stopping against the full epochs (issue 44): the train step's wall time and the test
metric, both arms in one invocation, alternating, on the same rows and seeds.

    ./.venv/bin/python benchmarks/early_stopping.py [--datasets banking77,wnut17]
        [--seeds 0,1] [--epochs 8] [--patience 2] [--min-delta 0.005]
        [--validation train|test-half] [--smoke]

Both arms train on the same rows with the same recipe (MiniLM, the offline default
checkpoint; learning rate 1e-4, batch 32, max_seq_length 64) and hold out the same
validation rows (validation_fraction 0.1 of the training file); the test rows are the data
set's dev file (test_uri). `--validation test-half` instead splits the dev file's sentences in
two by seed (validation_uri one half, test_uri the other) and trains on the whole training
file: WNUT17's training tweets and its dev texts come from different sources, so a
validation carved from train tracks a different distribution from the test rows (the shared
copy has no WNUT17 test file; selecting on dev and reporting on test is the set's own
protocol, halved here). CoNLL files only. Arms:
- `full`: every epoch, the last step's weights (best_checkpoint off); the run validates once,
  at its last step (a run with validation rows always does);
- `early`: validation at each epoch's end (eval_every_epoch), early_stopping_patience
  evaluations without a rise of more than early_stopping_min_delta end it, the best
  epoch's weights are saved. (With min_delta 0, BANKING77's validation accuracy still crept
  up by 0.001 every other epoch at epoch 7 of 8, and the run never stopped.)

Each run is `python -m tasks train` then `evaluate` through LocalCluster in a fresh
interpreter (common.run_step); the data and tokenize steps run once per data set and seed,
untimed. Measured per run: the train step's wall time, the steps it trained, the best
validation step, the test metric (accuracy for BANKING77, entity F1 for WNUT17) and the
seconds its validation evaluations took. Summaries: per arm the median wall and the test
metric per seed; `computed_wall_ratio` = median early / median full; `computed_metric_delta`
= mean(early) - mean(full); `computed_seed_spread` = the larger of the two arms' max - min over
seeds.

`--smoke`: a tiny random BERT on synthetic data, the first data set, 1 seed, 2 epochs,
results in a temporary folder; its steps fork from a warm-start server (common.run_step), as
`make airflow` runs them, where cold interpreters were most of its time in `make test`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from lib import common
from lib.common import median

DATASETS = {  # name: (train file, test file, task, test metric)
    "banking77": ("banking77/train.tsv", "banking77/dev.tsv", "classification", "accuracy"),
    "wnut17": ("wnut17/train.conll", "wnut17/dev.conll", "token_classification", "f1"),
}
RECIPE = {"learning_rate": 1e-4, "per_replica_batch_size": 32, "max_seq_length": 64,
          "warmup_ratio": 0.1, "weight_decay": 0.01, "validation_fraction": 0.1,
          "checkpoint_every_steps": 100_000}
ARMS = {
    "full": {"best_checkpoint": False},
    "early": {"eval_every_epoch": True, "best_checkpoint": True},
}


def split_conll_halves(source: Path, seed: int, out_dir: Path) -> tuple[Path, Path]:
    """The file's sentences shuffled by seed and cut in two: (validation, test)."""
    if source.suffix != ".conll":
        raise SystemExit(f"--validation test-half splits CoNLL files only, not {source}")
    sentences, current = [], []
    for line in source.read_text(encoding="utf-8").splitlines():
        if line.strip():
            current.append(line)
        elif current:
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    random.Random(seed).shuffle(sentences)
    half = len(sentences) // 2
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for role, part in (("validation", sentences[:half]), ("test", sentences[half:])):
        path = out_dir / f"{source.stem}-{role}-{seed}.conll"
        path.write_text("".join("\n".join(s) + "\n\n" for s in part), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def prepare(work: Path, name: str, seed: int, epochs: int, patience: int, min_delta: float,
            model_dir: str, warm_socket: Path | None = None,
            validation: str = "train") -> dict[str, Path]:
    """One run folder per arm, data and tokenize done (the arms share the token cache)."""
    train, test, task, _ = DATASETS[name]
    roles = {"test_uri": str(common.DATA_ROOT / test)}
    if validation == "test-half":
        halves = split_conll_halves(common.DATA_ROOT / test, seed, work / "halves")
        roles = {"validation_uri": str(halves[0]), "test_uri": str(halves[1])}
    runs = {}
    for arm, settings in ARMS.items():
        run_dir = work / "art" / "runs" / "early_stopping" / f"{name}-{seed}-{arm}"
        cfg = {"task": task, "train_uri": str(common.DATA_ROOT / train), **roles,
               "artifact_root": str(work / "art"),
               "base_model": model_dir, "seed": seed, "epochs": epochs, **RECIPE,
               **settings}
        if arm == "early":
            cfg.update(early_stopping_patience=patience, early_stopping_min_delta=min_delta)
        cfg_file = work / f"{name}-{seed}-{arm}.json"
        cfg_file.write_text(json.dumps(cfg))
        common.tasks_cli("init-run", "--run-dir", str(run_dir), "--config", str(cfg_file))
        for step in ("data", "tokenize"):
            common.run_step(step, run_dir, warm_socket)
        runs[arm] = run_dir
    return runs


def train_and_test(run_dir: Path, metric: str, warm_socket: Path | None = None) -> dict:
    """The train step, timed, then the evaluate step (it publishes the train step's test
    evaluation); the run's figures."""
    shutil.rmtree(run_dir / "train", ignore_errors=True)
    started = time.perf_counter()
    common.run_step("train", run_dir, warm_socket)
    wall = time.perf_counter() - started
    common.run_step("evaluate", run_dir, warm_socket)
    trained = json.loads((run_dir / "train" / "manifest.json").read_text())
    tested = json.loads((run_dir / "evaluate" / "manifest.json").read_text())
    history = json.loads((run_dir / "train" / "history.json").read_text())
    validated = trained["validation"]
    return {"train_wall_s": wall, "steps": trained["steps"],
            "total_steps": trained["total_steps"], "best_step": validated["best_step"],
            "stopped_early": validated["stopped_early"],
            "validation_value": validated["exported_value"],
            "validation_evaluations": len(history.get("validation") or []),
            "validation_s": sum(r["seconds"] for r in history.get("validation") or []),
            "test_metric": tested["metrics"][metric]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="banking77,wnut17")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--patience", type=int, default=2)
    ap.add_argument("--min-delta", type=float, default=0.005)
    ap.add_argument("--validation", choices=("train", "test-half"), default="train",
                    help="validation rows: a share of train, or half of the test file")
    ap.add_argument("--name", default="early_stopping", help="results file name")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    names = args.datasets.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="early-stopping-") as tmp, \
            contextlib.ExitStack() as stack:  # the warm-start server stops first
        work = Path(tmp)
        model_dir = ""  # the offline MiniLM checkpoint
        if args.smoke:
            common.smoke_results_dir()
            common.DATA_ROOT = common.smoke_task_data(work / "data", rows=96)
            smoke_banking = work / "data" / "banking77"
            smoke_banking.mkdir()
            common.smoke_data_root(work / "data", rows=96)
            for split in ("train", "dev"):
                shutil.copy(work / "data" / "snips" / "train.tsv", smoke_banking / f"{split}.tsv")
            model_dir = str(common.smoke_model_dir(work / "tiny-random-bert"))
            names, seeds, args.epochs = names[:1], seeds[:1], 2
        for name in names:
            common.require_data(*DATASETS[name][:2])
        results: dict[str, dict] = {}
        socket = stack.enter_context(common.smoke_warm_server(args.smoke,
                                                              work / "warm_start.log"))
        for name in names:
            metric = DATASETS[name][3]
            runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
            for seed in seeds:
                folders = prepare(work, name, seed, args.epochs, args.patience,
                                  args.min_delta, model_dir, socket, args.validation)
                for arm in (ARMS if seed % 2 == 0 else reversed(list(ARMS))):
                    run = train_and_test(folders[arm], metric, socket)
                    runs[arm].append({"seed": seed, **run})
                    print(f"{name} seed {seed} {arm}: {run['steps']}/{run['total_steps']} steps"
                          f" in {run['train_wall_s']:.1f} s, best step {run['best_step']}, "
                          f"test {metric} {run['test_metric']:.4f}", flush=True)
            walls = {arm: median([r["train_wall_s"] for r in runs[arm]]) for arm in ARMS}
            scores = {arm: [r["test_metric"] for r in runs[arm]] for arm in ARMS}
            results[name] = {
                "metric": metric, "runs": runs,
                "median_train_wall_s": walls,
                "computed_wall_ratio": walls["early"] / walls["full"],
                "computed_metric_delta": (sum(scores["early"]) / len(seeds)
                                          - sum(scores["full"]) / len(seeds)),
                "computed_seed_spread": max(max(s) - min(s) for s in scores.values())}
            r = results[name]
            print(f"{name}: early/full wall {r['computed_wall_ratio']:.2f}x (median "
                  f"{walls['early']:.1f} s vs {walls['full']:.1f} s); test {metric} "
                  f"{r['computed_metric_delta']:+.4f} (seed spread "
                  f"{r['computed_seed_spread']:.4f})", flush=True)
    common.write_results(args.name, {
        "smoke": args.smoke, "seeds": seeds, "epochs": args.epochs,
        "patience": args.patience, "min_delta": args.min_delta, "recipe": RECIPE,
        "validation": args.validation,
        "arms": ARMS, "datasets": results})


if __name__ == "__main__":
    main()
