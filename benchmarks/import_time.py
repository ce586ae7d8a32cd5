"""What a step process pays to import its modules, with and without the venv's .pyc files.

`make install` compiles them (uv --compile-bytecode). Without that, where
PYTHONDONTWRITEBYTECODE is set (as in this sandbox), no import ever writes them and every
process compiles TensorFlow's Python sources again. The "no .pyc" side reproduces that state
in the same venv: `-X pycache_prefix=<empty folder>` makes Python look for .pyc files only
there (it finds none) and PYTHONDONTWRITEBYTECODE keeps it from writing any. Both sides run
in one invocation, alternating; CPU is user+sys of the child process.

    ./.venv/bin/python benchmarks/import_time.py [--repeats 5] [--smoke]

`--smoke`: one run per side of a light module (`tasks`, which imports no TensorFlow), results
in a temporary folder (common.smoke_results_dir): the harness, not a figure.
"""
from __future__ import annotations

import argparse
import functools
import os
import resource
import subprocess
import sys
import tempfile
import time

from lib import common
from lib.common import PROJECT_ROOT, alternate, median, write_results

# tensorflow alone, and what `python -m tasks train` imports before it trains.
MODULES = ("tensorflow", "tasks.steps.train")


def run_import(module: str, no_pyc_prefix: str | None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of a fresh interpreter importing `module`."""
    argv = [sys.executable]
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    if no_pyc_prefix:
        argv += ["-X", f"pycache_prefix={no_pyc_prefix}"]
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([*argv, "-c", f"import {module}"], env=env, check=True,
                   cwd=PROJECT_ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true",
                        help="one run per side of a light module, results in a temporary folder")
    args = parser.parse_args()
    modules = MODULES
    if args.smoke:
        common.smoke_results_dir()
        args.repeats, modules = 1, ("tasks",)
    results = {"repeats": args.repeats, "smoke": args.smoke, "modules": {}}
    with tempfile.TemporaryDirectory(prefix="no-pyc-") as empty:
        for module in modules:
            print(f"import {module} (CPU seconds):")
            walls: dict[str, list[float]] = {"with_pyc": [], "no_pyc": []}

            def once(name: str, prefix: str | None) -> float:  # alternate() takes one figure
                cpu, wall = run_import(module, prefix)
                walls[name].append(wall)
                return cpu

            cpus = alternate({"with_pyc": functools.partial(once, "with_pyc", None),
                              "no_pyc": functools.partial(once, "no_pyc", empty)},
                             args.repeats)
            row = {name: {"cpu_seconds": cpus[name], "wall_seconds": walls[name],
                          "median_cpu_seconds": median(cpus[name]),
                          "median_wall_seconds": median(walls[name])} for name in cpus}
            row["no_pyc_over_with_pyc_cpu"] = (row["no_pyc"]["median_cpu_seconds"]
                                               / row["with_pyc"]["median_cpu_seconds"])
            results["modules"][module] = row
            print(f"  median CPU {row['with_pyc']['median_cpu_seconds']:.2f} s with .pyc, "
                  f"{row['no_pyc']['median_cpu_seconds']:.2f} s without: "
                  f"{row['no_pyc_over_with_pyc_cpu']:.2f}x")
    write_results("import_time", results)


if __name__ == "__main__":
    main()
