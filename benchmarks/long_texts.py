"""Long texts (issue 48): `long_text: window` against `truncate` on texts longer than the
model, both arms in one invocation, alternating, on the same rows and seeds: test accuracy,
and the train and evaluate steps' wall time per 1,000 texts.

    ./.venv/bin/python benchmarks/long_texts.py [--dataset sst2] [--seeds 0,1]
        [--min-words 300] [--max-words 1500] [--max-seq-length 128] [--stride 32]
        [--aggregation mean] [--epochs 2] [--smoke]

The long-text set (built in a temporary folder, never stored): the shared data set's rows
are taken in file order, per label; consecutive rows of one label are joined, separated by a
space, until the text holds at least a target number of words drawn uniformly from
[min_words, max_words] (random.Random(seed), one draw per text); a label's remainder shorter
than min_words is dropped. The texts are then shuffled with the same generator and split 80/20
into train and test files (`text`, `label`). On SST-2 a text is 30-150 phrases of one
sentiment, far past max_seq_length: truncation keeps its first pieces, windows all of them.

Both arms: the offline MiniLM checkpoint, learning rate 5e-5, batch 16, warm-up 0.1, the
same max_seq_length; `window` adds window_stride and window_aggregation. Each run is
`python -m tasks data`, `tokenize` (untimed), then `train` and `evaluate` through LocalCluster
in fresh interpreters (common.run_step), evaluate_in_train off so that the evaluate step is
timed on its own. Recorded per run: test accuracy, the train and evaluate steps' wall time,
the texts and windows the tokenize manifest counts; `computed_*` figures per 1,000 texts and
window minus truncate accuracy (mean over seeds).

`--smoke`: a tiny random BERT on synthetic rows, texts of 30-80 words, 1 seed, 1 epoch,
results in a temporary folder; its steps fork from a warm-start server (common.
smoke_warm_server: their cold starts were most of its time, and its figures mean nothing).
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from lib import common
from lib.common import median

DATASETS = {"sst2": "sst2/train.tsv"}
RECIPE = {"learning_rate": 5e-5, "per_replica_batch_size": 16, "warmup_ratio": 0.1,
          "weight_decay": 0.01, "checkpoint_every_steps": 100_000,
          "evaluate_in_train": False}
ARMS = ("truncate", "window")


def long_texts(source: Path, min_words: int, max_words: int, seed: int
               ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, test) rows of (text, label) joined from `source` by the module's rule."""
    rng = random.Random(seed)
    by_label: dict[str, list[str]] = {}
    with open(source, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            by_label.setdefault(row["label"], []).append(row["text"].strip())
    texts = []
    for label in sorted(by_label):
        words: list[str] = []
        target = rng.randint(min_words, max_words)
        for text in by_label[label]:
            words += text.split()
            if len(words) >= target:
                texts.append((" ".join(words), label))
                words, target = [], rng.randint(min_words, max_words)
    rng.shuffle(texts)
    cut = int(len(texts) * 0.8)
    return texts[:cut], texts[cut:]


def write_rows(path: Path, rows: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("text\tlabel\n")
        f.writelines(f"{text}\t{label}\n" for text, label in rows)


def prepare(work: Path, data: Path, seed: int, arm: str, args, model_dir: str,
            warm_socket: Path | None = None) -> Path:
    """The arm's run folder, its data and tokenize steps done."""
    run_dir = work / "art" / "runs" / "long_texts" / f"{seed}-{arm}"
    cfg = {"train_uri": str(data / "train.tsv"), "test_uri": str(data / "test.tsv"),
           "artifact_root": str(work / "art"), "base_model": model_dir, "seed": seed,
           "epochs": args.epochs, "max_seq_length": args.max_seq_length, **RECIPE}
    if arm == "window":
        cfg.update(long_text="window", window_stride=args.stride,
                   window_aggregation=args.aggregation)
    return common.prepared_run(run_dir, cfg, work / f"{seed}-{arm}.json", warm_socket)


def train_and_test(run_dir: Path, warm_socket: Path | None = None) -> dict:
    """The train and evaluate steps, each timed; the run's figures."""
    walls = {}
    for step in ("train", "evaluate"):
        started = time.perf_counter()
        common.run_step(step, run_dir, warm_socket)
        walls[step] = time.perf_counter() - started
    tokens = json.loads((run_dir / "tokenize" / "manifest.json").read_text())
    tested = json.loads((run_dir / "evaluate" / "manifest.json").read_text())
    train, test = tokens["splits"]["train"], tokens["splits"]["eval"]
    return {"train_wall_s": walls["train"], "evaluate_wall_s": walls["evaluate"],
            "train_texts": train["num_examples"], "test_texts": test["num_examples"],
            "train_records": train.get("num_records", train["num_examples"]),
            "test_records": test.get("num_records", test["num_examples"]),
            "test_texts_cut": test["num_truncated"] + test.get("num_windowed", 0),
            "test_accuracy": tested["metrics"]["accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="sst2", choices=sorted(DATASETS))
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--min-words", type=int, default=300)
    ap.add_argument("--max-words", type=int, default=1500)
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--stride", type=int, default=32)
    ap.add_argument("--aggregation", default="mean", choices=["mean", "max"])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--name", default="long_texts", help="results file name")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="long-texts-") as tmp, \
            common.smoke_warm_server(args.smoke, Path(tmp) / "warm_start.log") as socket:
        work = Path(tmp)
        model_dir = ""  # the offline MiniLM checkpoint
        if args.smoke:
            common.smoke_results_dir()
            common.DATA_ROOT = common.smoke_data_root(work / "data", rows=400)
            model_dir = str(common.smoke_model_dir(work / "tiny-random-bert"))
            seeds, args.epochs = seeds[:1], 1
            args.min_words, args.max_words, args.max_seq_length, args.stride = 30, 80, 16, 4
        (source,) = common.require_data(DATASETS[args.dataset])
        runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        sizes = {}
        for seed in seeds:
            train, test = long_texts(source, args.min_words, args.max_words, seed)
            data = work / f"long-{seed}"
            write_rows(data / "train.tsv", train)
            write_rows(data / "test.tsv", test)
            sizes[str(seed)] = {"train_texts": len(train), "test_texts": len(test),
                                "median_words": median([len(t.split()) for t, _ in train])}
            folders = {arm: prepare(work, data, seed, arm, args, model_dir, socket)
                       for arm in ARMS}
            for arm in (ARMS if seed % 2 == 0 else reversed(ARMS)):
                run = train_and_test(folders[arm], socket)
                runs[arm].append({"seed": seed, **run})
                print(f"seed {seed} {arm}: test accuracy {run['test_accuracy']:.4f}, train "
                      f"{run['train_wall_s']:.1f} s ({run['train_records']} records), "
                      f"evaluate {run['evaluate_wall_s']:.1f} s", flush=True)
            shutil.rmtree(work / "art", ignore_errors=True)  # checkpoints, caches

        def per_thousand(arm: str, wall: str, texts: str) -> float:
            return median([1000 * r[wall] / r[texts] for r in runs[arm]])

        accuracy = {arm: sum(r["test_accuracy"] for r in runs[arm]) / len(seeds)
                    for arm in ARMS}
        summary = {arm: {"mean_test_accuracy": accuracy[arm],
                         "computed_train_s_per_1000_texts":
                             per_thousand(arm, "train_wall_s", "train_texts"),
                         "computed_evaluate_s_per_1000_texts":
                             per_thousand(arm, "evaluate_wall_s", "test_texts")}
                   for arm in ARMS}
        delta = accuracy["window"] - accuracy["truncate"]
        print(f"window - truncate test accuracy {delta:+.4f}; per 1,000 texts train "
              f"{summary['window']['computed_train_s_per_1000_texts']:.1f} s vs "
              f"{summary['truncate']['computed_train_s_per_1000_texts']:.1f} s", flush=True)
    common.write_results(args.name, {
        "smoke": args.smoke, "dataset": args.dataset, "seeds": seeds, "epochs": args.epochs,
        "rule": {"min_words": args.min_words, "max_words": args.max_words, "split": 0.8},
        "max_seq_length": args.max_seq_length, "window_stride": args.stride,
        "window_aggregation": args.aggregation, "recipe": RECIPE, "sets": sizes,
        "runs": runs, "summary": summary, "computed_accuracy_delta": delta})


if __name__ == "__main__":
    main()
