"""Benchmark: the save a training worker makes on a preemption notice, at BERT-base size, to
local disk and to the GCS and S3 emulators, set against each platform's notice.

    ./.venv/bin/python benchmarks/preemption_save.py [--repeats 3] [--smoke]

`--smoke` uses a tiny random BERT and writes to a temporary folder, never benchmarks/results/.

The state saved is what tasks/steps/train.py checkpoints: bertflow's classifier at BERT-base
size (12 layers, hidden 768, vocabulary 30,522, 2 labels; RANDOM weights, the bytes do not
depend on the values) and its AdamW, whose two slots one optimizer step creates: 3 x 109.5M
float32 values, about 1.3 GB.

Two ways of saving alternate in this one invocation (A B, then B A, ...):
- `before`: what the Saver did before this benchmark: one data file per checkpoint
  (TensorFlow's default) and `storage.upload_dir` of the whole local checkpoints folder, which
  holds KEEP_CHECKPOINTS checkpoints once a run has saved that many;
- `after`: today's Saver: data files sharded at checkpoint_publish.SHARD_BYTES (parallel
  uploads) and `checkpoint_publish.publish`, which sends the new checkpoint and the index only.
Each repeat of a way times the local save (`tf.train.CheckpointManager.save` to a folder on
this machine's disk, the worker's working copy), then its upload to each run folder: another
local folder, the GCS emulator and the S3 emulator. The way's local folder first holds
KEEP_CHECKPOINTS - 1 earlier checkpoints (untimed), as a run's folder does.

The emulators run as their own processes on loopback (gcp-storage-emulator in memory and
moto_server, from this venv). Their speed is loopback plus the emulator's own Python, not a
cloud bucket's network: a cloud figure here says what the client and the bytes cost, and a
verdict against a cloud's notice is only as good as that. This machine's disk is shared and
noisy (the same plain write can take several times as long a minute later): quote medians.

The notices are the platforms' documented values (NOTICES, with their sources); the save must
fit in them together with the rest of the step in flight when the notice came.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from lib import common

# Seconds a worker has between the notice and being killed, and where each value comes from.
NOTICES = {
    "gke_standard_spot": {
        "seconds": 15,
        "source": "GKE, 'Spot VMs' (kubernetes-engine/docs/concepts/spot-vms): after the "
                  "preemption notice pods get 30 s of graceful termination, the first 15 s "
                  "for workload pods and the next 15 s for critical system pods (extendable "
                  "to 120 s on Standard node pools from GKE 1.35.0-gke.1171000)"},
    "gke_autopilot_spot_pods": {
        "seconds": 25,
        "source": "GKE, 'Run fault-tolerant workloads at lower costs in Spot Pods' "
                  "(kubernetes-engine/docs/how-to/autopilot-spot-pods): at most 25 s of "
                  "grace on preemption, whatever terminationGracePeriodSeconds asks"},
    "compute_engine_spot": {
        "seconds": 30,
        "source": "Compute Engine API, Scheduling.skipGuestOsShutdown: 30 s between ACPI G2 "
                  "Soft Off and G3 Mechanical Off for Spot VMs. TPU Spot VMs are Compute "
                  "Engine Spot VMs (Cloud TPU, 'Request TPU Spot VMs'); so are Vertex AI's "
                  "('Use Spot VMs with training'), which does not document the container's "
                  "own notice: assumed the VM's"},
    "eks_spot": {
        "seconds": 110,
        "source": "EC2 gives 2 minutes (Amazon EC2 User Guide, 'Spot Instance interruption "
                  "notices'); a pod drained at the notice (Karpenter's interruption handling "
                  "or aws-node-termination-handler) then gets its "
                  "terminationGracePeriodSeconds (Kubernetes PodSpec, 30 s by default), which "
                  "bertflow sets to 110 s on the spot pods of EKS and Karpenter "
                  "(tasks/provision/capacity.py EKS_SPOT_GRACE_SECONDS)"},
}
BERT_BASE = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 768,
             "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
             "max_position_embeddings": 512}
TINY = {"model_type": "bert", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}
BUCKET = "bertflow-bench"
S3_CONN_ID = "bertflow_bench_s3"
WAYS = ("before", "after")
DESTS = ("local", "gs", "s3")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # the server answered
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}: no answer in {timeout:.0f} s")
            time.sleep(0.2)


def start_emulators(log_dir: Path) -> tuple[list[subprocess.Popen], dict[str, str]]:
    """gcp-storage-emulator and moto_server as processes; the environment that points the
    product's storage at them (GCS the ambient way, S3 through an Airflow connection)."""
    venv_bin = Path(sys.executable).parent
    gcs_port, s3_port = _free_port(), _free_port()
    procs = [
        subprocess.Popen([str(venv_bin / "gcp-storage-emulator"), "start", "--host",
                          "127.0.0.1", "--port", str(gcs_port), "--in-memory",
                          "--default-bucket", BUCKET],
                         stdout=open(log_dir / "gcs.log", "w"), stderr=subprocess.STDOUT),
        subprocess.Popen([str(venv_bin / "moto_server"), "-H", "127.0.0.1", "-p", str(s3_port)],
                         stdout=open(log_dir / "s3.log", "w"), stderr=subprocess.STDOUT)]
    gcs, s3 = f"http://127.0.0.1:{gcs_port}", f"http://127.0.0.1:{s3_port}"
    _wait_http(gcs)
    _wait_http(s3)
    import boto3

    key_id, secret = "AKIABENCH", "bench-secret"  # the emulator's, not a real credential
    boto3.client("s3", endpoint_url=s3, region_name="us-east-1", aws_access_key_id=key_id,
                 aws_secret_access_key=secret).create_bucket(Bucket=BUCKET)
    env = {"STORAGE_EMULATOR_HOST": gcs,
           f"AIRFLOW_CONN_{S3_CONN_ID.upper()}": json.dumps({
               "conn_type": "aws", "login": key_id, "password": secret,
               "extra": {"endpoint_url": s3, "region_name": "us-east-1"}})}
    return procs, env


def build_state(raw: dict):
    """bertflow's classifier and AdamW with its slots, in a tf.train.Checkpoint as train.py
    makes it."""
    import tensorflow as tf

    from tasks.model.classifier import build_classifier
    from tasks.model.config import EncoderConfig
    from tasks.training.model import AdamW, NO_DECAY

    model = build_classifier(EncoderConfig.from_dict(raw), 2)
    optimizer = AdamW(learning_rate=1e-5, weight_decay=0.01, exclude_from_weight_decay=NO_DECAY)
    optimizer.apply_gradients([(tf.zeros_like(v), v) for v in model.trainable_variables])
    values = sum(v.shape.num_elements() for v in optimizer.variables()) + sum(
        v.shape.num_elements() for v in model.variables)
    return tf.train.Checkpoint(model=model, optimizer=optimizer), values


def remote_uri(dest: str, root: Path, way: str) -> str:
    if dest == "local":
        return str(root / "run-folders" / way / "train" / "checkpoints")
    return f"{dest}://{BUCKET}/run-{way}/train/checkpoints"


def one_save(way: str, manager, local: Path, step: int, root: Path) -> dict:
    """The timed save and its uploads for one way."""
    from tasks.io import storage
    from tasks.training import checkpoint_publish

    options = checkpoint_publish.save_options() if way == "after" else None
    started = time.perf_counter()
    manager.save(checkpoint_number=step, options=options)
    out = {"save_s": round(time.perf_counter() - started, 3), "upload_s": {}}
    files = sorted(p for p in local.iterdir() if p.is_file())
    new = [p for p in files if checkpoint_publish.checkpoint_name(p.name) == f"ckpt-{step}"]
    out["checkpoint_bytes"] = sum(p.stat().st_size for p in new)
    out["data_files"] = sum(".data-" in p.name for p in new)
    out["folder_bytes"] = sum(p.stat().st_size for p in files)
    for dest in DESTS:
        uri = remote_uri(dest, root, way)
        started = time.perf_counter()
        if way == "after":
            checkpoint_publish.publish(manager, local, uri)
        else:
            storage.upload_dir(local, uri)
        out["upload_s"][dest] = round(time.perf_counter() - started, 3)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        common.smoke_results_dir()
        args.repeats = 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from tasks.io import storage
    from tasks.steps.train import KEEP_CHECKPOINTS
    from tasks.training import checkpoint_publish

    root = Path(tempfile.mkdtemp(prefix="bertflow-preemption-save-"))
    procs, env = start_emulators(root)
    try:
        os.environ.update(env)
        storage.configure(storage.Connections(aws_conn_id=S3_CONN_ID))
        raw = TINY if args.smoke else BERT_BASE
        checkpoint, values = build_state(raw)
        managers, steps = {}, {}
        for way in WAYS:  # a folder as a run's is after KEEP_CHECKPOINTS - 1 saves
            managers[way] = tf.train.CheckpointManager(
                checkpoint, str(root / "workers" / way), max_to_keep=KEEP_CHECKPOINTS)
            options = checkpoint_publish.save_options() if way == "after" else None
            for step in range(1, KEEP_CHECKPOINTS):
                managers[way].save(checkpoint_number=step, options=options)
            steps[way] = KEEP_CHECKPOINTS
        order, runs = [], {way: [] for way in WAYS}
        for repeat in range(args.repeats):
            for way in (WAYS if repeat % 2 == 0 else WAYS[::-1]):
                run = one_save(way, managers[way], root / "workers" / way, steps[way], root)
                steps[way] += 1
                order.append(way)
                runs[way].append(run)
                print(f"{way}: save {run['save_s']:.2f} s, upload "
                      + ", ".join(f"{d} {s:.2f} s" for d, s in run["upload_s"].items()),
                      flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)

    summary = {}
    for way in WAYS:
        save = common.median([r["save_s"] for r in runs[way]])
        summary[way] = {"median_save_s": save, "median_upload_s": {}, "median_total_s": {}}
        for dest in DESTS:
            upload = common.median([r["upload_s"][dest] for r in runs[way]])
            total = common.median([r["save_s"] + r["upload_s"][dest] for r in runs[way]])
            summary[way]["median_upload_s"][dest] = round(upload, 3)
            summary[way]["median_total_s"][dest] = round(total, 3)
        summary[way]["median_save_s"] = round(save, 3)
    speedup = {dest: round(summary["before"]["median_total_s"][dest]
                           / summary["after"]["median_total_s"][dest], 2) for dest in DESTS}
    fits = {name: {dest: {
        "headroom_s": round(notice["seconds"] - summary["after"]["median_total_s"][dest], 2),
        "fits": summary["after"]["median_total_s"][dest] < notice["seconds"]}
        for dest in DESTS} for name, notice in NOTICES.items()}

    print(f"\nstate saved: {values / 1e6:.1f}M float32 values "
          f"({runs['after'][0]['checkpoint_bytes'] / 1e9:.2f} GB a checkpoint)")
    for way in WAYS:
        s = summary[way]
        print(f"{way:>6}: median save {s['median_save_s']:.2f} s; save + upload "
              + ", ".join(f"{d} {t:.2f} s" for d, t in s["median_total_s"].items()))
    print("before / after (median totals): "
          + ", ".join(f"{d} {r:.2f}x" for d, r in speedup.items()))
    for name, by_dest in fits.items():
        print(f"{name} ({NOTICES[name]['seconds']} s): " + ", ".join(
            f"{d} {'fits' if f['fits'] else 'DOES NOT FIT'} ({f['headroom_s']:+.1f} s left "
            f"for the step in flight)" for d, f in by_dest.items()))
    common.write_results("preemption_save", {
        "smoke": args.smoke,
        "model": "tiny random BERT" if args.smoke else "BERT-base shapes, random weights",
        "model_config": raw,
        "state_values": values,
        "keep_checkpoints": KEEP_CHECKPOINTS,
        "shard_bytes": checkpoint_publish.SHARD_BYTES,
        "repeats": args.repeats,
        "order": order,
        "notices": NOTICES,
        "runs": runs,
        "summary": summary,
        "before_over_after": speedup,
        "fits_after": fits,
    })


if __name__ == "__main__":
    main()
