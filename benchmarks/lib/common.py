"""Shared helpers for the benchmarks: data location, timing, medians, machine facts, results.

Every benchmark is one command (`./.venv/bin/python benchmarks/<name>.py`), prints its figures
and writes `benchmarks/results/<name>.json` (written atomically: tmp file then rename).

`--smoke` (every script has it) runs a tiny version in seconds and writes to a temporary
folder, never to benchmarks/results/: set $BERTFLOW_BENCH_RESULTS_DIR to choose the folder.
Results files hold no absolute path of the machine: `portable` rewrites the checkout's paths
relative to it, the shared data root's as `<data>/...`, temporary folders as `<tmp>/...`.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

BENCH_DIR = Path(__file__).resolve().parent.parent  # benchmarks/ (this file is in lib/)
PROJECT_ROOT = BENCH_DIR.parent
# Where write_results writes: benchmarks/results/, or $BERTFLOW_BENCH_RESULTS_DIR (smoke runs,
# tests). A smoke run with the variable unset gets a fresh temporary folder (smoke_results_dir).
RESULTS_ENV = "BERTFLOW_BENCH_RESULTS_DIR"
RESULTS_DIR = Path(os.environ.get(RESULTS_ENV) or BENCH_DIR / "results")
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


def smoke_results_dir() -> Path:
    """The results folder of a --smoke run: $BERTFLOW_BENCH_RESULTS_DIR, else a new temporary
    folder. Never benchmarks/results/ (a smoke run measures nothing worth keeping)."""
    global RESULTS_DIR
    if os.environ.get(RESULTS_ENV):
        RESULTS_DIR = Path(os.environ[RESULTS_ENV])
    else:
        RESULTS_DIR = Path(tempfile.mkdtemp(prefix="bertflow-bench-smoke-"))
    if RESULTS_DIR.resolve() == (BENCH_DIR / "results").resolve():
        raise SystemExit(f"error: a --smoke run must not write to benchmarks/results/ "
                         f"(${RESULTS_ENV} points there)")
    return RESULTS_DIR


def smoke_model_dir(out: Path) -> Path:
    """A tiny RANDOM BERT checkpoint (2 layers, hidden 32; the MiniLM checkpoint's uncased
    vocabulary) for --smoke runs: config.json, vocab.txt, model.safetensors."""
    from lib import synthetic_inputs
    return synthetic_inputs.write_random_checkpoint(synthetic_inputs.MODELS["tiny"], out,
                                                    synthetic_inputs.vocab_file())


def smoke_batches(model_dir: Path, out: Path, batch: int = 4, steps: int = 3,
                  seq: int = 16) -> Path:
    """`steps` synthetic batches (random whole-word rows, truncated to `seq` tokens) in the
    format trainbench_data.build writes, for --smoke runs: no shared data needed."""
    from lib import synthetic_inputs
    return synthetic_inputs.write_batches(model_dir / "vocab.txt", seq, batch, steps, out)


def smoke_data_root(root: Path, rows: int = 64) -> Path:
    """A data root holding sst2/train.tsv and snips/train.tsv (`text`, `label`): `rows`
    synthetic rows of two classes each, for --smoke runs (set DATA_ROOT to it)."""
    import random

    rng = random.Random(0)
    words = ["good", "bad", "film", "plot", "actors", "fine", "dull", "great", "poor", "story"]
    for name, labels in (("sst2", ("0", "1")), ("snips", ("PlayMusic", "GetWeather"))):
        (root / name).mkdir(parents=True, exist_ok=True)
        with open(root / name / "train.tsv", "w", encoding="utf-8") as f:
            f.write("text\tlabel\n")
            for i in range(rows):
                f.write(" ".join(rng.choices(words, k=rng.randint(3, 12)))
                        + f"\t{labels[i % 2]}\n")
    return root


def smoke_task_data(root: Path, rows: int = 64) -> Path:
    """Synthetic files of the other tasks under `root`, for --smoke runs: goemotions/
    train.tsv and dev.tsv (`text`, `labels`: one to three of four names joined by ','), and
    wnut17/train.conll and dev.conll (`rows` sentences of 3 to 12 tab-separated token and BIO
    tag lines, empty lines between)."""
    import random

    rng = random.Random(0)
    words = ["good", "bad", "film", "plot", "actors", "fine", "dull", "great", "poor", "story"]
    names = ["joy", "anger", "neutral", "surprise"]
    (root / "goemotions").mkdir(parents=True, exist_ok=True)
    (root / "wnut17").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", rows), ("dev", rows // 4)):
        with open(root / "goemotions" / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("text\tlabels\n")
            for i in range(n):
                labels = [names[i % 4], *rng.sample(names, rng.randint(0, 2))]
                f.write(" ".join(rng.choices(words, k=rng.randint(3, 12))) + "\t"
                        + ",".join(dict.fromkeys(labels)) + "\n")
        with open(root / "wnut17" / f"{split}.conll", "w", encoding="utf-8") as f:
            for _ in range(n):
                tags, i, length = [], 0, rng.randint(3, 12)
                while i < length:
                    if rng.random() < 0.2:
                        kind = rng.choice(["person", "location"])
                        span = min(rng.randint(1, 3), length - i)
                        tags += [f"B-{kind}"] + [f"I-{kind}"] * (span - 1)
                        i += span
                    else:
                        tags.append("O")
                        i += 1
                for tag in tags:
                    f.write(f"{rng.choice(words)}\t{tag}\n")
                f.write("\n")
    return root


# Absolute paths in results files: an absolute path starts a string or follows a blank, `=`,
# `(` or a quote; not after `:` (URIs), a word (`ex/s`) or a `<label>` this module wrote.
_ABS_PATH = re.compile(r"(?<![\w.:/~<>-])/(?:[\w.+@-]+/)*[\w.+@-]+")
# Machine-independent paths a result may name as facts (the kernel's files).
_NOT_MACHINE_PATHS = ("/proc/", "/sys/", "/dev/")


def absolute_paths(value: Any) -> list[str]:
    """Every absolute path of the machine in a JSON value's strings (keys included)."""
    found: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            found += absolute_paths(k) + absolute_paths(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            found += absolute_paths(v)
    elif isinstance(value, str):
        found += [m for m in _ABS_PATH.findall(value) if "/" in m[1:]
                  and not m.startswith(_NOT_MACHINE_PATHS)]
    return found


def _prefixes() -> list[tuple[str, str]]:
    """(absolute prefix, replacement), longest first: checkout, data root, temp folders."""
    pairs = []
    for root, label in ((DATA_ROOT, "<data>"), (Path(tempfile.gettempdir()), "<tmp>"),
                        (Path("/tmp"), "<tmp>")):
        for form in {str(root), str(Path(root).resolve())}:
            pairs.append((form.rstrip("/"), label))
    for form in {str(PROJECT_ROOT), str(PROJECT_ROOT.resolve())}:
        pairs.append((form.rstrip("/"), "."))
    return sorted(pairs, key=lambda p: -len(p[0]))


def portable(value: Any) -> Any:
    """The value with the machine's absolute paths rewritten: the checkout's as relative
    (`./.venv/bin/python`), the shared data root's as `<data>/sst2/train.tsv`, temporary
    folders' as `<tmp>/...`; any other as `<abs>/<its last part>`."""
    if isinstance(value, dict):
        return {portable(k): portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    if not isinstance(value, str) or "/" not in value:
        return value
    prefixes = _prefixes()

    def one(m: re.Match) -> str:
        path = m.group(0)
        if "/" not in path[1:] or path.startswith(_NOT_MACHINE_PATHS):
            return path
        for prefix, label in prefixes:
            if path == prefix or path.startswith(prefix + "/"):
                rest = path[len(prefix):].lstrip("/")
                if label == ".":
                    return rest or "."
                return f"{label}/{rest}" if rest else label
        return "<abs>/" + path.rstrip("/").rsplit("/", 1)[-1]
    return _ABS_PATH.sub(one, value)


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
    # no absolute path of the machine (data root, venv, temp folders) goes into a results file
    payload = portable(json.loads(json.dumps(payload, default=str)))
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
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


# The product's interpreter: benchmarks run bertflow's steps as its users do.
PRODUCT_PYTHON = str(PROJECT_ROOT / ".venv" / "bin" / "python")


def worker_env(env: dict[str, str] | None = None, bench_dir: Path = BENCH_DIR) -> dict[str, str]:
    """`env` (default: this process's) with `bench_dir` first on PYTHONPATH: a worker run by
    path from benchmarks/workers/ imports the shared helpers as `lib.<module>`, as the
    scripts on top do (no benchmark edits the import path: tests/test_imports.py)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(bench_dir), env.get("PYTHONPATH"))
                                        if p)
    return env


def tasks_cli(*argv: str) -> str:
    """`python -m tasks ARGV` in the product's venv from the checkout's root; the last line
    it prints (a manifest URI). RuntimeError with the end of stderr when it fails."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([PRODUCT_PYTHON, "-m", "tasks", *argv], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"python -m tasks {' '.join(argv)} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]


def prepared_run(run_dir: Path, cfg: dict, cfg_file: Path,
                 warm_socket: Path | None = None) -> Path:
    """A run folder from `cfg` (written to `cfg_file`) with its data and tokenize steps done,
    untimed: the start of every benchmark run that times the steps after them. With
    `warm_socket` the two steps fork from that warm-start server, else each is a fresh
    interpreter (run_step either way)."""
    cfg_file.write_text(json.dumps(cfg))
    tasks_cli("init-run", "--run-dir", str(run_dir), "--config", str(cfg_file))
    for step in ("data", "tokenize"):
        run_step(step, run_dir, warm_socket)
    return run_dir


def run_step(step: str, run_dir: Path, warm_socket: Path | None = None) -> None:
    """`python -m tasks STEP --run-dir RUN` as the DAG runs it on the local backend: through
    LocalCluster, forked from the warm-start server when there is one (warm), else a fresh
    interpreter (cold). A warm run that started cold is an error, not a slower figure.
    Evaluate after a train step that evaluated (evaluate_in_train) starts no process: the
    DAG's controller publishes those metrics itself (bertflow_airflow/worker_operator.py)."""
    from tasks.provision.local import warm_start
    from tasks.provision.local.cluster import LocalCluster
    from tasks.provision.spec import WorkerSpec
    from tasks.errors import WorkerError
    from tasks.runs.runlayout import load_run
    from tasks.steps import evaluation_publish

    if step == "evaluate" and evaluation_publish.from_train(*load_run(str(run_dir))):
        return
    if warm_socket:
        os.environ[warm_start.SOCKET_ENV] = str(warm_socket)
    else:
        os.environ.pop(warm_start.SOCKET_ENV, None)
    lines: list[str] = []
    cluster = LocalCluster(WorkerSpec(command=["python", "-m", "tasks", step, "--run-dir",
                                               str(run_dir)]), log=lines.append)
    try:
        cluster.run()
    except WorkerError as err:
        raise RuntimeError(f"python -m tasks {step} failed: {err}\n"
                           + "\n".join(lines[-40:])) from err
    cold = [line for line in lines if "cold start" in line]
    if warm_socket and cold:
        raise RuntimeError(f"{step} started cold beside the warm-start server: {cold[0]}")


@contextlib.contextmanager
def warm_server(wanted: bool, log_path: Path, reuse: bool = False):
    """(socket, seconds it took to serve) of a warm-start server for the block, or
    (None, None) when not `wanted`. Started once, before the runs, as `make airflow` starts
    one for the scheduler's lifetime: its start is recorded apart, in no run's wall time.
    With `reuse` (a smoke's), the server that $BERTFLOW_WARM_SOCKET names when it serves
    (the test session's: tests/conftest.py), and None seconds: no second server imports
    TensorFlow. run_step fails if a step still starts cold beside it."""
    if not wanted:
        yield None, None
        return
    from tasks.provision.local import warm_start

    serving = os.environ.get(warm_start.SOCKET_ENV)
    if reuse and serving and Path(serving).is_socket():
        yield Path(serving), None
        return
    started = time.perf_counter()
    with warm_start.serving(log_path=log_path) as socket:
        yield socket, time.perf_counter() - started


@contextlib.contextmanager
def smoke_warm_server(smoke: bool, log_path: Path):
    """For a --smoke run (`smoke`), the socket of a warm-start server for its steps (warm_server
    reused), else None. A smoke's figures mean nothing, and its steps' cold starts
    (TensorFlow's import in each) were most of its time; a forked step runs the same code
    (tasks/provision/local/warm_start.py)."""
    with warm_server(smoke, log_path, reuse=True) as (socket, _):
        yield socket
