"""Tuned per-label thresholds against one global threshold on GoEmotions (issue 48): micro- and
macro-F1 on the test rows at 0.5, at 0.3 and at the thresholds tuned on the validation rows,
all three from the same trained weights of each seed.

    ./.venv/bin/python benchmarks/tuned_thresholds.py [--seeds 0,1] [--epochs 1] [--smoke]

Per seed, one run: GoEmotions' train.tsv with `multi_label_threshold: tuned` and
`validation_fraction` 0.1 (a seeded, stratified share of the training rows: the thresholds
are chosen there), dev.tsv as the test rows (test_uri; never read to choose). The recipe is
quality.py's GoEmotions one (MiniLM, the offline default checkpoint; learning rate 2e-4,
6% warm-up, batch 32, max_seq_length 128). The train step evaluates the test rows at the
tuned thresholds; the evaluate step then runs twice more on the saved weights, with the run's
config changed to the global 0.5 and 0.3 (evaluate_in_train off, so it loads the model
and counts at that threshold). Per seed and arm: micro_f1, macro_f1, subset_accuracy; per
seed the tuned thresholds and the labels that fell back to 0.5 (fewer than
tasks/thresholds.MIN_POSITIVES validation positives). Summaries: each arm's mean
over seeds, and `computed_delta_vs_0_5` / `computed_delta_vs_0_3` = mean tuned - mean global.

`--smoke`: a tiny random BERT on synthetic GoEmotions-shaped rows, 1 seed, 1 epoch, results
in a temporary folder (timings and figures mean nothing there). Its steps (but init-run) fork
from a warm-start server, as `make airflow` runs them: in fresh interpreters they were most
of the smoke's time in `make test` (the cold steps stay covered by evaluation_cost's and
long_texts' smokes).
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from lib import common

TRAIN, TEST = "goemotions/train.tsv", "goemotions/dev.tsv"
RECIPE = {"task": "multi_label", "label_column": "labels", "learning_rate": 2e-4,
          "warmup_ratio": 0.06, "per_replica_batch_size": 32, "max_seq_length": 128,
          "weight_decay": 0.01, "validation_fraction": 0.1,
          "checkpoint_every_steps": 100_000}
GLOBAL = (0.5, 0.3)
METRICS = ("micro_f1", "macro_f1", "subset_accuracy")


def prepare(work: Path, seed: int, epochs: int, model_dir: str,
            warm_socket: Path | None = None) -> Path:
    """The seed's run folder with data and tokenize done."""
    run_dir = work / "art" / "runs" / "tuned_thresholds" / f"goemotions-{seed}"
    cfg = {"train_uri": str(common.DATA_ROOT / TRAIN), "test_uri": str(common.DATA_ROOT / TEST),
           "artifact_root": str(work / "art"), "base_model": model_dir, "seed": seed,
           "epochs": epochs, "multi_label_threshold": "tuned", **RECIPE}
    return common.prepared_run(run_dir, cfg, work / f"goemotions-{seed}.json", warm_socket)


def test_metrics(run_dir: Path) -> dict:
    """The evaluate step's published figures."""
    tested = json.loads((run_dir / "evaluate" / "manifest.json").read_text())
    metrics = json.loads(Path(tested["metrics_uri"]).read_text())
    return {m: metrics[m] for m in METRICS}


def at_global(run_dir: Path, threshold: float, warm_socket: Path | None = None) -> dict:
    """The evaluate step again on the saved weights, the run's config at one global
    threshold (and evaluating in its own process: the train step's figures are the tuned
    ones)."""
    from tasks.runs import runlayout

    cfg, ctx = runlayout.load_run(str(run_dir))
    runlayout.write_run_config(ctx, cfg.model_copy(update={
        "multi_label_threshold": threshold, "evaluate_in_train": False}))
    shutil.rmtree(run_dir / "evaluate", ignore_errors=True)
    common.run_step("evaluate", run_dir, warm_socket)
    return test_metrics(run_dir)


def one_seed(work: Path, seed: int, epochs: int, model_dir: str,
             warm_socket: Path | None = None) -> dict:
    run_dir = prepare(work, seed, epochs, model_dir, warm_socket)
    common.run_step("train", run_dir, warm_socket)
    # publishes the train step's tuned evaluation
    common.run_step("evaluate", run_dir, warm_socket)
    arms = {"tuned": test_metrics(run_dir)}
    for threshold in GLOBAL:
        arms[f"global_{threshold}"] = at_global(run_dir, threshold, warm_socket)
    record = json.loads((run_dir / "train" / "manifest.json").read_text())["thresholds"]
    return {"seed": seed, "arms": arms, "validation_rows": record["validation_rows"],
            "thresholds": {label: e["threshold"] for label, e in record["per_label"].items()},
            "fallback_labels": sorted(label for label, e in record["per_label"].items()
                                      if e["fallback"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--name", default="tuned_thresholds", help="results file name")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="tuned-thresholds-") as tmp, \
            common.smoke_warm_server(args.smoke, Path(tmp) / "warm_start.log") as socket:
        work = Path(tmp)
        model_dir = ""  # the offline MiniLM checkpoint
        if args.smoke:
            common.smoke_results_dir()
            common.DATA_ROOT = common.smoke_task_data(work / "data", rows=96)
            model_dir = str(common.smoke_model_dir(work / "tiny-random-bert"))
            seeds, args.epochs = seeds[:1], 1
        common.require_data(TRAIN, TEST)
        runs = []
        for seed in seeds:
            run = one_seed(work, seed, args.epochs, model_dir, socket)
            runs.append(run)
            print(f"seed {seed}: " + "; ".join(
                f"{arm} micro {m['micro_f1']:.4f} macro {m['macro_f1']:.4f}"
                for arm, m in run["arms"].items())
                + f"; {len(run['fallback_labels'])} labels fell back", flush=True)
    arms = list(runs[0]["arms"])
    means = {arm: {m: sum(r["arms"][arm][m] for r in runs) / len(runs) for m in METRICS}
             for arm in arms}
    deltas = {f"computed_delta_vs_{str(t).replace('.', '_')}": {
        m: means["tuned"][m] - means[f"global_{t}"][m] for m in METRICS} for t in GLOBAL}
    for name, delta in deltas.items():
        print(f"{name}: micro {delta['micro_f1']:+.4f} macro {delta['macro_f1']:+.4f}",
              flush=True)
    common.write_results(args.name, {
        "smoke": args.smoke, "seeds": seeds, "epochs": args.epochs, "recipe": RECIPE,
        "global_thresholds": list(GLOBAL), "runs": runs, "mean": means, **deltas})


if __name__ == "__main__":
    main()
