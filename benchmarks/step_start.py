"""A local step process started cold (a fresh interpreter) against one forked from a warm-start
server (tasks/provision/local/warm_start.py), both through LocalCluster, alternating in one
invocation.

The step is `python -m tasks train` on a tiny random BERT (2 layers, hidden 32) and 64 rows:
so small that what it pays before training (importing TensorFlow, transformers, the steps)
is most of its cost, as it is for the short processes of a test suite or a smoke run. The
process's CPU is user+sys from wait4: for the cold side this process's child, for the warm
side the server's (it reports them). The server's own start (the one-time preload) is
measured too, and the break-even that follows from it is computed, not measured.

    ./.venv/bin/python benchmarks/step_start.py [--repeats 5] [--smoke]

`--smoke`: one run per side, results in a temporary folder (common.smoke_results_dir).
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from lib import common
from lib.common import PROJECT_ROOT, alternate, median, write_results

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

from tasks.provision.local.cluster import LocalCluster  # noqa: E402
from tasks.provision.spec import WorkerSpec
from tasks.provision.local import warm_start


def tiny_run(root: Path) -> str:
    """A run folder ready for train (tests/train_helpers.py, as the unit tests make one)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "train_helpers", PROJECT_ROOT / "tests" / "train_helpers.py")
    train_helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_helpers)
    model = train_helpers.write_tiny_model(root / "model")
    _, ctx = train_helpers.make_run(root / "artifacts", model, num_train=64, num_eval=16,
                                    epochs=1)
    return ctx.run_uri


class Side:
    """Runs the train step once per call; keeps wall seconds, returns CPU seconds."""

    def __init__(self, run_uri: str, socket: str | None):
        self.run_uri, self.socket = run_uri, socket
        self.walls: list[float] = []

    def __call__(self) -> float:
        # Each repeat trains from the base model: no checkpoint of an earlier repeat to resume.
        shutil.rmtree(Path(self.run_uri) / "train", ignore_errors=True)
        if self.socket:
            os.environ[warm_start.SOCKET_ENV] = self.socket
        else:
            os.environ.pop(warm_start.SOCKET_ENV, None)
        cluster = LocalCluster(WorkerSpec(command=["python", "-m", "tasks", "train",
                                                   "--run-dir", self.run_uri]),
                               log=lambda line: None)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        cluster.run()
        self.walls.append(time.perf_counter() - started)
        [proc] = cluster._procs  # noqa: SLF001  (the one process it ran)
        if self.socket:
            if not isinstance(proc.popen, warm_start.WarmProcess):
                raise SystemExit("the warm side started cold: see the server's log")
            return proc.popen.cpu_seconds
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true",
                        help="one run per side, results in a temporary folder")
    args = parser.parse_args()
    if args.smoke:
        common.smoke_results_dir()
        args.repeats = 1
    with tempfile.TemporaryDirectory(prefix="step-start-") as tmp:
        run_uri = tiny_run(Path(tmp))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        with warm_start.serving(log_path=Path(tmp) / "warm_start.log") as socket:
            server_wall = time.perf_counter() - started
            sides = {"cold": Side(run_uri, None), "warm": Side(run_uri, str(socket))}
            cpus = alternate(sides, args.repeats)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Reaped children's CPU includes the server's own (its preload and loop) and, through the
    # server, its forked children's: subtract both sides' processes to leave the server's.
    server_cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                  - sum(cpus["cold"]) - sum(cpus["warm"]))
    results = {"repeats": args.repeats, "smoke": args.smoke, "step": "train (tiny random BERT, 64 rows, 1 epoch)",
               "sides": {name: {"cpu_seconds": cpus[name], "wall_seconds": sides[name].walls,
                                "median_cpu_seconds": median(cpus[name]),
                                "median_wall_seconds": median(sides[name].walls)}
                         for name in sides},
               "server": {"cpu_seconds": server_cpu, "ready_wall_seconds": server_wall}}
    saved = results["sides"]["cold"]["median_cpu_seconds"] - \
        results["sides"]["warm"]["median_cpu_seconds"]
    results["cold_over_warm_cpu"] = (results["sides"]["cold"]["median_cpu_seconds"]
                                     / results["sides"]["warm"]["median_cpu_seconds"])
    results["cold_over_warm_wall"] = (results["sides"]["cold"]["median_wall_seconds"]
                                      / results["sides"]["warm"]["median_wall_seconds"])
    # Computed from the medians above, not measured: processes after which the server's own
    # CPU is paid back.
    results["computed_break_even_processes"] = server_cpu / saved if saved > 0 else None
    for name, side in results["sides"].items():
        print(f"{name}: median CPU {side['median_cpu_seconds']:.2f} s, "
              f"wall {side['median_wall_seconds']:.2f} s")
    print(f"cold/warm: CPU {results['cold_over_warm_cpu']:.2f}x, "
          f"wall {results['cold_over_warm_wall']:.2f}x; the server: {server_cpu:.1f} CPU-s, "
          f"ready after {server_wall:.1f} s (computed break-even: "
          f"{results['computed_break_even_processes'] or float('nan'):.1f} processes)")
    write_results("step_start", results)


if __name__ == "__main__":
    main()
