"""Shared helpers for the benchmarks: data location, timing, medians, machine facts, results.

Every benchmark is one command (`./.venv/bin/python benchmarks/<name>.py`), prints its figures
and writes `benchmarks/results/<name>.json` (written atomically: tmp file then rename).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
# The shared data sets (sst2/, snips/, banking77/) live beside the checkout, in ../shared/data.
DATA_ENV = "BERTFLOW_SHARED_DATA"
DATA_ROOT = Path(os.environ.get(DATA_ENV) or PROJECT_ROOT.parent / "shared" / "data")

# Flags that matter for dense-math speed on CPU (full list goes into the JSON).
_INTERESTING_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                      "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile", "avx_vnni")

def require_data(*relative: str) -> list[Path]:
    """Paths under the shared data root. A missing one is an error (exit 2) that names it and
    the variable to set: a benchmark that measured nothing must not look like a success."""
    paths = [DATA_ROOT / r for r in relative]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(f"benchmark: error: data not found: {', '.join(missing)}; set {DATA_ENV} to the "
              f"folder holding sst2/, snips/ and banking77/ (default: ../shared/data beside "
              f"the checkout)", file=sys.stderr)
        sys.exit(2)
    return paths


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def alternate(sides: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run each side `repeats` times, interleaved A B A B ... (the CPU is shared, so load drifts
    hit both sides alike). Each callable returns one figure; returns {side: [figures]}."""
    out: dict[str, list[float]] = {k: [] for k in sides}
    for i in range(repeats):
        order = list(sides) if i % 2 == 0 else list(reversed(list(sides)))
        for name in order:
            v = sides[name]()
            out[name].append(v)
            print(f"  [{i + 1}/{repeats}] {name}: {v:,.1f}", flush=True)
    return out


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = cpu_flags()
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        mem_gib = None
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "mem_gib": mem_gib,
        "key_cpu_flags": [f for f in _INTERESTING_FLAGS if f in flags],
        "cpu_flags": flags,
        "python": platform.python_version(),
        "load_avg_at_start": os.getloadavg(),
    }


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_results(name: str, results: dict[str, Any], quiet: bool = False) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "date_utc": utc_now(),
        # the script that ran, not the results name (--name may differ from it)
        "command": f"./.venv/bin/python benchmarks/{Path(sys.argv[0]).name} "
                   + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        **results,
    }
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    tmp.replace(path)
    if not quiet:
        shown = path.relative_to(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else path
        print(f"wrote {shown}")
    return path


def verdict(value: float, target: float, unit: str = "") -> str:
    """'met (x / target)' or 'MISSED by N% (x vs target)'."""
    if value >= target:
        return f"met ({value:,.3g}{unit} >= {target:,.3g}{unit})"
    return f"MISSED by {100 * (1 - value / target):.0f}% ({value:,.3g}{unit} < {target:,.3g}{unit})"
