"""Where the tokenize step's time goes (companion of tokenize_throughput.py).

    ./.venv/bin/python benchmarks/profile_tokenize.py [--limit N]

Runs `tasks.steps.tokenize.run` on SST-2 train once warm, then once under cProfile with its thread
pool swapped for a serial map (cProfile only sees the main thread), and prints the functions
by cumulative and own time. Single-thread shares, so they add up to the CPU time, not wall.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import tempfile
import time
from pathlib import Path

from lib import common


class SerialPool:
    def __init__(self, *_a, **_k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, *its):
        return map(fn, *its)

    def submit(self, fn, *a, **k):
        from concurrent.futures import Future
        f = Future()
        f.set_result(fn(*a, **k))
        return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    (sst2,) = common.require_data("sst2/train.tsv")
    import tasks.steps.tokenize as tk
    from tasks.steps import data as data_step
    from tasks.config import RunConfig
    from tasks.runs.runlayout import RunContext, write_run_config
    work = Path(tempfile.mkdtemp(prefix="bench-tokprof-"))
    src = sst2
    if args.limit:
        src = work / "train.tsv"
        src.write_text("".join(open(sst2, encoding="utf-8").readlines()[:args.limit + 1]))
    cfg = RunConfig(train_uri=str(src), eval_uri=None, artifact_root=str(work / "a0"))
    ctx = RunContext(str(work / "a0"), "b", "t")
    write_run_config(ctx, cfg)
    data_step.run(cfg, ctx)
    rows = sum(s["num_examples"] for s in
               __import__("json").loads((work / "a0/runs/b/t/data/manifest.json").read_text())
               ["splits"].values())

    def once(i: int) -> float:
        shutil.copytree(work / "a0" / "runs", work / f"a{i}" / "runs")
        c = cfg.model_copy(update={"artifact_root": str(work / f"a{i}")})
        t0 = time.perf_counter()
        tk.run(c, RunContext(str(work / f"a{i}"), "b", "t"))
        return time.perf_counter() - t0

    once(1)  # warm: TensorFlow start-up is not the step's cost
    threaded = once(2)
    if hasattr(tk, "ThreadPoolExecutor"):
        tk.ThreadPoolExecutor = SerialPool
    prof = cProfile.Profile()
    prof.enable()
    serial = once(3)
    prof.disable()
    shutil.rmtree(work, ignore_errors=True)
    print(f"{rows:,} rows: threaded step {threaded:.3f}s ({rows / threaded:,.0f} rows/s); "
          f"serial+profiled {serial:.3f}s")
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(args.top)
        print(out.getvalue().split("\n", 6)[-1][:6000])


if __name__ == "__main__":
    main()
