"""What one validation evaluation during training costs (issue 44), at MiniLM's and
bert-base's shapes, and its share of the training time at two intervals.

    ./.venv/bin/python benchmarks/evaluation_cost.py [--models minilm,bert-base]
        [--repeats 2] [--smoke]

Per repeat, the models alternate; each run is the train step (`python -m tasks train` in a
fresh interpreter through LocalCluster, common.run_step) on BANKING77's training file with
validation_fraction 0.1 (about 1,000 validation rows), the test rows being its dev file
(never read here), and the product's defaults otherwise (batch 16, max_seq_length 128, the
fit loop). It trains `max_steps` steps with `eval_every_steps` set so that it validates four
times. bert-base has RANDOM weights (lib/synthetic_inputs.py; the time does not depend on the
values) and MiniLM's uncased vocabulary, which is bert-base's.

Measured per run: each evaluation's seconds (history.json `validation[].seconds`; the first
includes tracing the evaluation function and is reported apart as `first_evaluation_s`),
the training step's seconds (global batch / the train manifest's examples_per_second, which
leaves evaluations out), the validation rows, and the steps per epoch.
Computed from the medians over runs (`computed_*`): the steady evaluation's seconds per
1,000 validation rows, and its share of the training wall time, eval / (eval + interval x
step), at one evaluation per epoch (eval_every_epoch) and every 100 steps.

`--smoke`: a tiny random BERT on synthetic rows, MiniLM's name, one repeat, results in a
temporary folder.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from lib import common
from lib.common import median

TRAIN, TEST = "banking77/train.tsv", "banking77/dev.tsv"
RECIPE = {"task": "classification", "validation_fraction": 0.1, "epochs": 1,
          "checkpoint_every_steps": 100_000, "seed": 0}
STEPS = {"minilm": (160, 40), "bert-base": (40, 10)}  # model: (max_steps, eval_every_steps)
INTERVAL_STEPS = 100


def model_dirs(names: list[str], work: Path, smoke: bool) -> dict[str, str]:
    from lib import synthetic_inputs

    if smoke:
        return {names[0]: str(common.smoke_model_dir(work / "tiny-random-bert"))}
    dirs = {"minilm": ""}  # the offline MiniLM checkpoint
    if "bert-base" in names:
        dirs["bert-base"] = str(synthetic_inputs.write_random_checkpoint(
            synthetic_inputs.MODELS["bert-base"], work / "bert-base",
            synthetic_inputs.vocab_file()))
    return {n: dirs[n] for n in names}


def prepare(work: Path, name: str, model_dir: str, steps: tuple[int, int]) -> Path:
    run_dir = work / "art" / "runs" / "evaluation_cost" / name
    cfg = {"train_uri": str(common.DATA_ROOT / TRAIN), "test_uri": str(common.DATA_ROOT / TEST),
           "artifact_root": str(work / "art"), "base_model": model_dir, **RECIPE,
           "max_steps": steps[0], "eval_every_steps": steps[1]}
    return common.prepared_run(run_dir, cfg, work / f"{name}.json")


def train(run_dir: Path) -> dict:
    shutil.rmtree(run_dir / "train", ignore_errors=True)
    common.run_step("train", run_dir)
    trained = json.loads((run_dir / "train" / "manifest.json").read_text())
    history = json.loads((run_dir / "train" / "history.json").read_text())
    data = json.loads((run_dir / "data" / "manifest.json").read_text())
    seconds = [r["seconds"] for r in history["validation"]]
    return {"steps": trained["steps"], "steps_per_epoch": history["steps_per_epoch"],
            "validation_rows": data["splits"]["validation"]["num_examples"],
            "step_s": trained["global_batch_size"] / trained["examples_per_second"],
            "first_evaluation_s": seconds[0], "evaluation_s": seconds[1:]}


def summary(runs: list[dict]) -> dict:
    evaluation = median([s for r in runs for s in r["evaluation_s"]])
    step = median([r["step_s"] for r in runs])
    rows, per_epoch = runs[0]["validation_rows"], runs[0]["steps_per_epoch"]
    share = {"per_epoch": evaluation / (evaluation + per_epoch * step),
             f"every_{INTERVAL_STEPS}_steps": evaluation / (evaluation + INTERVAL_STEPS * step)}
    return {"median_evaluation_s": evaluation, "median_step_s": step,
            "median_first_evaluation_s": median([r["first_evaluation_s"] for r in runs]),
            "computed_evaluation_s_per_1000_rows": evaluation * 1000 / rows,
            "computed_share_of_training": share}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="minilm,bert-base")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    names = args.models.split(",")
    unknown = sorted(set(names) - set(STEPS))
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    with tempfile.TemporaryDirectory(prefix="evaluation-cost-") as tmp:
        work = Path(tmp)
        steps = dict(STEPS)
        if args.smoke:
            common.smoke_results_dir()
            common.DATA_ROOT = common.smoke_data_root(work / "data", rows=240)
            (work / "data" / "banking77").mkdir()
            for split in ("train", "dev"):
                shutil.copy(work / "data" / "snips" / "train.tsv",
                            work / "data" / "banking77" / f"{split}.tsv")
            names, args.repeats = names[:1], 1
            steps = {names[0]: (6, 2)}
        common.require_data(TRAIN, TEST)
        dirs = model_dirs(names, work, args.smoke)
        folders = {n: prepare(work, n, dirs[n], steps[n]) for n in names}
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for repeat in range(args.repeats):
            for name in (names if repeat % 2 == 0 else names[::-1]):
                run = train(folders[name])
                runs[name].append(run)
                print(f"{name} repeat {repeat}: step {run['step_s']:.3f} s, evaluations "
                      f"{run['first_evaluation_s']:.2f} s (first), "
                      + ", ".join(f"{s:.2f}" for s in run["evaluation_s"]) + " s", flush=True)
        results = {n: {"max_steps": steps[n][0], "eval_every_steps": steps[n][1],
                       "runs": runs[n], **summary(runs[n])} for n in names}
    for name, r in results.items():
        shares = r["computed_share_of_training"]
        print(f"{name}: {r['median_evaluation_s']:.2f} s per evaluation of "
              f"{r['runs'][0]['validation_rows']} rows; " + ", ".join(
                  f"{k} {v:.1%}" for k, v in shares.items()), flush=True)
    common.write_results("evaluation_cost", {
        "smoke": args.smoke, "repeats": args.repeats, "recipe": RECIPE,
        "interval_steps": INTERVAL_STEPS, "models": results})


if __name__ == "__main__":
    main()
