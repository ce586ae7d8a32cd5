"""How the data and tokenize steps' cost grows with the rows: time, rows/s and peak RSS.

`./.venv/bin/python benchmarks/scale.py` (default sizes 100k, 1M, 10M rows; `--sizes` to
choose, `--s3-size` for the run through moto's S3 server on loopback, 0 to skip).

Data sets are generated from SST-2 and SNIPS rows with variation (a prefix and a suffix
phrase drawn per row, 9 labels) as TSV files on local disk under `--work` (default
/tmp/bertflow-scale, outside the repository; the 10M-row file is deleted afterwards unless
`--keep`). For each size, the steps run as the DAG runs them: a fresh process imports the DAG
file (Airflow) and executes its `WorkerStepOperator` for `prepare_data` and then `tokenize`,
which start `python -m tasks data|tokenize` worker processes through the configured
(local) backend. Recorded per step: wall time of the controller (process start, imports and
the step), rows/s, the controller's (= the Airflow task process's) peak RSS and its worker's
peak RSS (VmHWM of the process; `getrusage` maximum over its waited-for children, an upper bound
since it also counts the controller's RSS at exec time). Then one epoch of the
training input pipeline alone (tasks.training.inputs.train_dataset over the tokenized shards, batches
of 32, no model) at the largest size, in its own process, for its time and peak RSS.

Targets (issue 11): peak RSS of any process <= 1.5 GB at 10M rows; data + tokenize rows/s at
10M >= 80% of that at 100k; the Airflow task process < 300 MB at every size.
Results: benchmarks/results/scale.json and scale.svg (time and memory against rows).
`--smoke`: 300 synthetic rows (common.smoke_data_root), no S3 run, the input epoch, results
in a temporary folder (common.smoke_results_dir), work files in a temporary folder.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lib import common
from lib.common import PROJECT_ROOT, require_data, write_results

GB = 1 << 30
TARGETS = {"max_rss_bytes": int(1.5 * GB), "throughput_ratio": 0.8,
           "airflow_task_rss_bytes": 300 << 20}
PREFIXES = ["", "", "", "honestly ", "well , ", "so ", "i think ", "please ", "ok ", "hey , ",
            "you know , ", "basically ", "to be fair , ", "again , ", "quick one : "]
SUFFIXES = ["", "", "", " .", " !", " , right ?", " please", " today", " for me", " again",
            " now", " , thanks", " in 2026", " at once", " ( edited )"]


# --- data ----------------------------------------------------------------------------------
def base_rows() -> list[tuple[str, str]]:
    sst2, snips = require_data("sst2/train.tsv", "snips/train.tsv")
    rows = []
    for path, prefix in ((sst2, "sst2_"), (snips, "")):
        for line in path.read_text(encoding="utf-8").splitlines()[1:]:
            text, _, label = line.rpartition("\t")
            text = text.strip().replace('"', "'")
            if text:
                rows.append((text, prefix + label.strip()))
    return rows


def generate(path: Path, n: int, rows: list[tuple[str, str]]) -> None:
    """n TSV rows: base rows drawn with replacement, each with a random prefix and suffix
    (15 x 15 variants of each of the 80k base rows)."""
    if path.exists() and path.with_suffix(".done").exists():
        return
    rng = random.Random(n)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8", buffering=1 << 22) as out:
        out.write("text\tlabel\n")
        done = 0
        while done < n:
            k = min(100_000, n - done)
            picks = rng.choices(rows, k=k)
            pre = rng.choices(PREFIXES, k=k)
            suf = rng.choices(SUFFIXES, k=k)
            out.write("".join(f"{p}{t}{s}\t{y}\n" for (t, y), p, s in zip(picks, pre, suf)))
            done += k
    tmp.rename(path)
    path.with_suffix(".done").touch()


# --- one step under its controller, as Airflow runs it --------------------------------------
CONTROLLER = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import importlib.util
spec = importlib.util.spec_from_file_location("bert_finetune_dag", sys.argv[3] + "/dags/bert_finetune.py")
dag_module = importlib.util.module_from_spec(spec); spec.loader.exec_module(dag_module)
op = dag_module.WorkerStepOperator(task_id=sys.argv[1], step=sys.argv[1].replace("prepare_data", "data"), run_uri=sys.argv[2])
t1 = time.perf_counter()
op.execute({})
t2 = time.perf_counter()
# VmHWM: this process's own peak. (ru_maxrss of a process started by fork/vfork + exec
# also counts its parent's RSS at exec time, e.g. the moto server's objects held by the
# benchmark process.)
hwm = [int(ln.split()[1]) * 1024 for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
print("SCALE " + json.dumps({
    "controller_rss": hwm,
    "controller_ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "worker_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
    "import_seconds": t1 - t0, "step_seconds": t2 - t1}))
"""


def run_step(task_id: str, run_uri: str, env: dict) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CONTROLLER, task_id, run_uri,
                           str(PROJECT_ROOT)], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("SCALE ")]
    if proc.returncode or not marker:
        raise SystemExit(f"{task_id} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {"wall_seconds": wall, **json.loads(marker[-1][6:])}


def run_pipeline(rows: int, train_uri: str, root: str, env: dict) -> dict:
    from tasks.config import parse_config
    from tasks.runs.runlayout import RunContext, init_run
    from tasks.io import storage
    from tasks.provision.local.backend import LocalBackend
    from tasks.provision.local.cluster import local_tmp_root

    cfg = parse_config({"train_uri": train_uri, "eval_uri": "", "artifact_root": root,
                        "num_shards": 8, "max_seq_length": 128})
    ctx = RunContext(root, "scale", f"rows-{rows}")
    run_uri = init_run(cfg, ctx)
    run_uri = ctx.run_uri
    out = {"rows": rows, "train_uri": train_uri}
    for task_id in ("prepare_data", "tokenize"):
        out[task_id] = step = run_step(task_id, run_uri, env)
        step["rows_per_second"] = rows / step["wall_seconds"]
        print(f"  {rows:>11,} rows  {task_id:<12} {step['wall_seconds']:7.1f} s "
              f"{step['rows_per_second']:>10,.0f} rows/s  worker peak RSS "
              f"{step['worker_rss'] / 2**20:7.0f} MB  Airflow task process "
              f"{step['controller_rss'] / 2**20:5.0f} MB", flush=True)
    # The DAG's release step: it removes the workers' scratch folders (not their shared
    # parent, which other runs may be using; this benchmark runs alone).
    LocalBackend().release(cfg, ctx, log=lambda _: None)
    with contextlib.suppress(OSError):
        local_tmp_root(run_uri).parent.rmdir()
    data = storage.read_json(ctx.manifest_uri("data"))
    out["split"] = split_tolerance(data, cfg.eval_fraction)
    total = out["prepare_data"]["wall_seconds"] + out["tokenize"]["wall_seconds"]
    out["end_to_end"] = {"wall_seconds": total, "rows_per_second": rows / total}
    out["tokenize_manifest"] = ctx.manifest_uri("tokenize")
    return out


def split_tolerance(manifest: dict, fraction: float) -> dict:
    """Per class: eval rows vs n * fraction."""
    train, evals = (manifest["splits"][s]["label_counts"] for s in ("train", "eval"))
    worst = max(abs(evals[k] - (train[k] + evals[k]) * fraction) for k in train)
    total = sum(train.values()) + sum(evals.values())
    return {"max_abs_rows_off_per_class": worst,
            "eval_fraction_achieved": sum(evals.values()) / total, "eval_fraction": fraction}


INPUT_EPOCH = r"""
import json, resource, sys, time
import tasks  # TF_USE_LEGACY_KERAS
from tasks.io import storage
from tasks.training import inputs
tok = storage.read_json(sys.argv[1])
n = tok["splits"]["train"]["num_examples"]
batch = 32
with inputs.local_shards(tok, "train") as files:
    ds = inputs.train_dataset(files, batch, tok["max_seq_length"], seed=1, num_rows=n)
    steps = n // batch
    t0 = time.perf_counter()
    rows = 0
    for features, labels in ds.take(steps):
        rows += int(labels.shape[0])
    seconds = time.perf_counter() - t0
print("SCALE " + json.dumps({"rows": rows, "seconds": seconds, "rows_per_second": rows / seconds,
                             "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def input_epoch(tokenize_manifest: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", INPUT_EPOCH, tokenize_manifest],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("SCALE ")]
    if proc.returncode or not marker:
        raise SystemExit(f"input epoch failed:\n{proc.stderr[-3000:]}")
    return json.loads(marker[-1][6:])


# --- S3 on loopback --------------------------------------------------------------------------
def s3_run(rows: int, path: Path, work: Path, env: dict) -> dict:
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    creds = {"AWS_ACCESS_KEY_ID": "scale", "AWS_SECRET_ACCESS_KEY": "scale-secret",
             "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="scale", aws_secret_access_key="scale-secret")
        client.create_bucket(Bucket="scale")
        client.upload_file(str(path), "scale", f"data/{path.name}")
        os.environ.update(creds)
        return run_pipeline(rows, f"s3://scale/data/{path.name}", "s3://scale/artifacts",
                            {**env, **creds})
    finally:
        server.stop()


# --- plot ------------------------------------------------------------------------------------
def svg_plot(results: list[dict], path: Path) -> None:
    """Two panels, log-log: seconds and peak RSS (MB) against rows, per process."""
    import math

    w, h, pad = 420, 300, 55
    series_time = {"prepare_data": "#1f77b4", "tokenize": "#d62728", "end_to_end": "#2ca02c"}
    series_mem = {"data worker": "#1f77b4", "tokenize worker": "#d62728",
                  "Airflow task process": "#7f7f7f"}
    xs = [r["rows"] for r in results]

    def panel(x0, title, ylabel, series, values, ymin, ymax):
        lx = lambda v: x0 + pad + (math.log10(v) - math.log10(min(xs))) / max(  # noqa: E731
            1e-9, math.log10(max(xs)) - math.log10(min(xs))) * (w - 2 * pad)
        ly = lambda v: h - pad + -(math.log10(v) - math.log10(ymin)) / (  # noqa: E731
            math.log10(ymax) - math.log10(ymin)) * (h - 2 * pad)
        out = [f'<text x="{x0 + w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
               f'<line x1="{x0 + pad}" y1="{h - pad}" x2="{x0 + w - pad}" y2="{h - pad}" stroke="black"/>',
               f'<line x1="{x0 + pad}" y1="{pad}" x2="{x0 + pad}" y2="{h - pad}" stroke="black"/>',
               f'<text x="{x0 + w / 2}" y="{h - 15}" text-anchor="middle" font-size="11">rows (log)</text>',
               f'<text x="{x0 + 12}" y="{h / 2}" font-size="11" transform="rotate(-90 {x0 + 12} {h / 2})" text-anchor="middle">{ylabel}</text>']
        for x in xs:
            out.append(f'<text x="{lx(x)}" y="{h - pad + 14}" text-anchor="middle" font-size="10">{x:,}</text>')
        for y in (10 ** k for k in range(int(math.floor(math.log10(ymin))), int(math.ceil(math.log10(ymax))) + 1)):
            if ymin <= y <= ymax:
                out.append(f'<text x="{x0 + pad - 4}" y="{ly(y) + 3}" text-anchor="end" font-size="10">{y:g}</text>')
        for i, (name, color) in enumerate(series.items()):
            pts = " ".join(f"{lx(x)},{ly(v)}" for x, v in zip(xs, values[name]))
            out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
            out.append(f'<text x="{x0 + pad + 8}" y="{pad + 14 * i}" font-size="10" fill="{color}">{name}</text>')
        return out

    times = {k: [r[k]["wall_seconds"] for r in results] for k in series_time}
    mems = {"data worker": [r["prepare_data"]["worker_rss"] / 2**20 for r in results],
            "tokenize worker": [r["tokenize"]["worker_rss"] / 2**20 for r in results],
            "Airflow task process": [max(r["prepare_data"]["controller_rss"],
                                         r["tokenize"]["controller_rss"]) / 2**20
                                     for r in results]}
    all_t = [v for vs in times.values() for v in vs]
    parts = panel(0, "time per step (s)", "seconds", series_time, times,
                  min(all_t) / 1.5, max(all_t) * 1.5)
    parts += panel(w, "peak RSS per process (MB)", "MB", series_mem, mems, 50, 3000)
    y15 = None
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h}" '
           f'font-family="sans-serif">' + "".join(parts) + "</svg>\n")
    del y15
    path.write_text(svg)


def compare_writers(n: int, work: Path, repeats: int = 2) -> int:
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"scale-{n}.tsv"
    generate(path, n, base_rows())
    runs = {"hand-written": [], "library": []}
    for i in range(repeats):
        order = list(runs) if i % 2 == 0 else list(reversed(list(runs)))
        for writer in order:
            env = {**os.environ,
                   "BERTFLOW_TFRECORD_WRITER": "library" if writer == "library" else ""}
            root = work / f"writers-{writer}-{i}"
            subprocess.run(["rm", "-rf", str(root)], check=True)
            print(f"[{i + 1}/{repeats}] {writer}:", flush=True)
            r = run_pipeline(n, str(path), str(root), env)
            runs[writer].append({"data": r["prepare_data"]["wall_seconds"],
                                 "tokenize": r["tokenize"]["wall_seconds"],
                                 "end_to_end": r["end_to_end"]["wall_seconds"]})
            subprocess.run(["rm", "-rf", str(root)], check=True)
    med = {w: {k: statistics.median(x[k] for x in v) for k in v[0]} for w, v in runs.items()}
    ratio = med["library"]["end_to_end"] / med["hand-written"]["end_to_end"]
    print(json.dumps({"medians_seconds": med, "library_over_hand_written": ratio}, indent=2))
    write_results("scale_writers", {
        "rows": n, "load_average": os.getloadavg(), "runs": runs, "medians_seconds": med,
        "library_over_hand_written_end_to_end": ratio,
        "rule": "keep the hand-written writer only if the library path is > 1.3x slower"})
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--s3-size", type=int, default=1_000_000)
    parser.add_argument("--work", default="/tmp/bertflow-scale")
    parser.add_argument("--keep", action="store_true", help="keep the generated 10M-row file")
    parser.add_argument("--no-input-epoch", action="store_true")
    parser.add_argument("--name", default="scale")
    parser.add_argument("--compare-writers", type=int, default=0, metavar="ROWS",
                        help="only compare the TFRecord writers (hand-written vs "
                             "tf.io.encode_proto + TFRecordWriter): data + tokenize at ROWS, "
                             "alternating, 2 runs each; writes results/scale_writers.json")
    parser.add_argument("--smoke", action="store_true",
                        help="300 synthetic rows, no S3 run, results in a temporary folder")
    args = parser.parse_args()
    if args.smoke:
        import tempfile

        common.smoke_results_dir()
        args.sizes, args.s3_size, args.compare_writers = "300", 0, 0
        args.work = tempfile.mkdtemp(prefix="bench-scale-smoke-")
        common.DATA_ROOT = common.smoke_data_root(Path(args.work) / "data")
    if args.compare_writers:
        return compare_writers(args.compare_writers, Path(args.work))
    work = Path(args.work)
    if str(work.resolve()).startswith(str(PROJECT_ROOT)):
        raise SystemExit("--work must be outside the repository")
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    base = base_rows()
    env = dict(os.environ)
    results = []
    for n in sizes:
        path = work / f"scale-{n}.tsv"
        t0 = time.perf_counter()
        generate(path, n, base)
        print(f"data set: {n:,} rows, {path.stat().st_size / 2**20:,.0f} MB "
              f"({time.perf_counter() - t0:.0f} s to generate)", flush=True)
        root = work / f"artifacts-{n}"
        subprocess.run(["rm", "-rf", str(root)], check=True)
        results.append(run_pipeline(n, str(path), str(root), env))
        results[-1]["file_bytes"] = path.stat().st_size
    epoch = None
    if not args.no_input_epoch:
        epoch = input_epoch(results[-1]["tokenize_manifest"], env)
        print(f"  input pipeline, one epoch of {epoch['rows']:,} rows: {epoch['seconds']:.1f} s "
              f"({epoch['rows_per_second']:,.0f} rows/s), peak RSS "
              f"{epoch['peak_rss'] / 2**20:.0f} MB", flush=True)
    s3 = None
    if args.s3_size:
        path = work / f"scale-{args.s3_size}.tsv"
        generate(path, args.s3_size, base)
        print(f"S3 on loopback (moto), {args.s3_size:,} rows:", flush=True)
        s3 = s3_run(args.s3_size, path, work, env)
    for n in sizes:
        root = work / f"artifacts-{n}"
        subprocess.run(["rm", "-rf", str(root)], check=True)
        if n >= 10_000_000 and not args.keep:
            (work / f"scale-{n}.tsv").unlink(missing_ok=True)
            (work / f"scale-{n}.done").unlink(missing_ok=True)

    small, large = results[0], results[-1]
    max_rss = max(max(r[s]["worker_rss"], r[s]["controller_rss"]) for r in results
                  for s in ("prepare_data", "tokenize"))
    if epoch:
        max_rss = max(max_rss, epoch["peak_rss"])
    ratio = large["end_to_end"]["rows_per_second"] / small["end_to_end"]["rows_per_second"]
    airflow = max(r[s]["controller_rss"] for r in results + ([s3] if s3 else [])
                  for s in ("prepare_data", "tokenize"))
    marginal = None
    if len(results) >= 2:
        a, b = results[-2], results[-1]
        marginal = (b["rows"] - a["rows"]) / (b["end_to_end"]["wall_seconds"]
                                              - a["end_to_end"]["wall_seconds"])
    verdict = {
        "max_rss_bytes": max_rss, "max_rss_ok": max_rss <= TARGETS["max_rss_bytes"],
        "throughput_ratio_largest_vs_smallest": ratio,
        "throughput_ok": ratio >= TARGETS["throughput_ratio"],
        "airflow_task_rss_bytes": airflow,
        "airflow_task_ok": airflow < TARGETS["airflow_task_rss_bytes"],
        "marginal_rows_per_second_last_two_sizes": marginal,
    }
    print(json.dumps(verdict, indent=2))
    for r in results + ([s3] if s3 else []):
        r.pop("tokenize_manifest", None)
    if args.smoke:
        subprocess.run(["rm", "-rf", str(work)], check=True)
    write_results(args.name, {"smoke": args.smoke, "load_average": os.getloadavg(), "targets": TARGETS,
                              "results": results, "s3": s3, "input_epoch": epoch,
                              "verdict": verdict})
    if len(results) >= 2:
        svg_plot(results, common.RESULTS_DIR / f"{args.name}.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
