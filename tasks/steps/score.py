"""Score step (`python -m tasks score --run-dir RUN`): a worker of a batch-scoring run.

Each of the run's num_workers processes (the same worker spec as training: local processes,
Kubernetes pods, a Vertex AI job; its place in TF_CONFIG's cluster, chief first, says which
one this is) loads the model version's SavedModel and scores the shards k with
k mod num_workers == its index, in the plan's order (tasks/scoring/plan.py). A shard is
written to local temporary files, moved into place (tasks/io/storage.py: readers never see
half a file) and then recorded
(tasks/scoring/shards.py): a shard already recorded is skipped, so a retried or preempted
worker redoes only the rest and every input row is scored exactly once.

Each output row: `file` and `line` of the input row, its `id` (id_column), the SavedModel's
outputs for the task (classification: `label`, `probabilities`; multi_label: `labels`,
`probabilities`; regression: `score`; token_classification: `entities`, each with
`entity_group`, `start`, `end` (character offsets), `word`, `score`) and `model_version`;
as JSON Lines or, with output_format parquet, as Parquet columns (tasks/scoring/parts.py).

Worker 0 returns only when every shard is recorded (a backend ends a step when its first
worker ends), then writes the step's manifest; the publish task checks the counts and writes
_COMPLETE.json. The controllers end the attempt when a worker dies where they can see it (a
local process's exit, a failed pod); for what they cannot see (a peer that hangs, a Vertex AI
replica restarting in place without end), worker 0 gives up when no shard has been published
for `peer_wait_seconds` (or STALL_FACTOR times the slowest shard, if longer) and fails,
naming the missing shards: the task's retry scores only those.
"""
from __future__ import annotations

import json
import tempfile
import time
from contextlib import closing
from pathlib import Path

from tasks.config import RunConfig
from tasks.errors import WorkerError
from tasks.io import storage
from tasks.io.scoring_parquet import open_score_file
from tasks.io.uris import join_uri, sha256_file
from tasks.runs import runlayout
from tasks.runs.runlayout import RunContext
from tasks.scoring import shards
from tasks.scoring.parts import part_writer, suffix
from tasks.scoring.plan import read_plan, read_score_config
from tasks.topology import worker_position

WAIT_SECONDS = 0.5  # worker 0's poll for its peers' shards
# A peer's next shard may take this many times the slowest shard seen so far (rows differ in
# length; a shared machine slows down) before worker 0 takes the peer for dead or stuck.
STALL_FACTOR = 4


def run(cfg: RunConfig, ctx: RunContext) -> str:
    score_cfg = read_score_config(ctx)
    plan = read_plan(ctx)
    output, model = plan["output_uri"], plan["model"]
    index, count = worker_position()  # chief (Vertex AI's pool 0) first, then the workers
    mine = [s for s in plan["shards"] if s["index"] % count == index]
    done = shards.published(output)
    todo = [s for s in mine if s["name"] not in done]
    print(f"score: worker {index} of {count}: {len(mine)} shard(s), {len(mine) - len(todo)} "
          f"already published (skipped), model {model['version']}", flush=True)
    if todo:
        serve = _load(model["version_uri"])
        for shard in todo:
            record = score_shard(serve, score_cfg, shard, output, model)
            print(f"score: {shard['name']}: {record['rows']} rows, {record['error_rows']} "
                  f"unreadable, {record['seconds']:.2f} s", flush=True)
    if index != 0:
        return ""
    owners = {s["name"]: s["index"] % count for s in plan["shards"]}
    done = wait_for_peers(output, owners, score_cfg.peer_wait_seconds)
    return runlayout.write_manifest(ctx.step_uri("score"), {
        "output_uri": output, "shards": len(owners), "workers": count,
        "rows": sum(done[n]["rows"] for n in owners),
        "error_rows": sum(done[n]["error_rows"] for n in owners)})


def wait_for_peers(output: str, owners: dict[str, int], floor: float,
                   poll: float = WAIT_SECONDS) -> dict[str, dict]:
    """Worker 0's wait for the other workers' shards (`owners`: shard name -> its worker).
    Published records are the peers' heartbeat: when none has come for max(floor,
    STALL_FACTOR x the slowest shard recorded), WorkerError names the missing shards."""
    count, since = -1, time.monotonic()
    while True:
        done = shards.published(output)
        missing = [name for name in sorted(owners) if name not in done]
        if not missing:
            return done
        if len(done) != count:  # progress: a peer is alive
            count, since = len(done), time.monotonic()
        slowest = max((r.get("seconds") or 0.0 for r in done.values()), default=0.0)
        limit = max(floor, STALL_FACTOR * slowest)
        if time.monotonic() - since > limit:
            named = ", ".join(f"{n} (worker {owners[n]})" for n in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise WorkerError(
                f"no shard published for {limit:.0f} s (peer_wait_seconds {floor:g}, or "
                f"{STALL_FACTOR}x the slowest shard, {slowest:.1f} s): a worker died or hangs; "
                f"{len(missing)} shard(s) missing: {named}{more}. The task's retry scores "
                "only the missing shards; raise peer_wait_seconds if the workers are slow")
        time.sleep(poll)


def _load(version_uri: str):
    from tasks.steps.gate_eval import load_saved_model

    with storage.staged_local_dir(join_uri(version_uri, "saved_model")) as saved_model:
        loaded = load_saved_model(str(saved_model))
    serve = loaded.signatures["serving_default"]
    serve.owner = loaded  # keeps the variables alive with the signature
    return serve


def output_rows(served: dict[str, list], count: int) -> list[dict]:
    """The SavedModel's outputs per row, as a JSON reader wants them: entities as a list of
    objects cut to each text's num_entities, multi-label names without the "" padding."""
    rows = []
    for i in range(count):
        row = {name: values[i] for name, values in served.items()}
        if "num_entities" in row:
            n = row.pop("num_entities")
            fields = ("entity_group", "start", "end", "word", "score")
            row = {"entities": [{f: row[f][j] for f in fields} for j in range(n)]}
        elif "labels" in row:
            row["labels"] = [name for name in row["labels"] if name]
        rows.append(row)
    return rows


def score_shard(serve, cfg, shard: dict, output: str, model: dict) -> dict:
    """Score one shard's rows batch by batch, publish its files, then its record."""
    from tasks.steps.gate_eval import serve_rows

    started = time.time()
    source = open_score_file(shard["file"], cfg.file_format, cfg.text_column,
                             cfg.text_pair_column, cfg.id_column)
    rows = errors = 0
    fmt = cfg.output_format
    with tempfile.TemporaryDirectory(prefix="bertflow-score-") as tmp:
        part, bad = Path(tmp) / f"part{suffix(fmt)}", Path(tmp) / "errors.jsonl"
        out = part_writer(fmt, part, model["task"], bool(cfg.id_column), model)
        with closing(out), open(bad, "w", encoding="utf-8") as err:
            batch = []

            def flush():
                inputs = {"text": [r.text for r in batch]}
                if model["has_pair"]:
                    inputs["text_pair"] = [r.text_pair for r in batch]
                served = serve_rows(serve, inputs, cfg.batch_size)
                scored = []
                for row, outputs in zip(batch, output_rows(served, len(batch))):
                    named = {"file": shard["file"], "line": row.line}
                    if cfg.id_column:
                        named["id"] = row.id
                    scored.append({**named, **outputs, "model_version": model["version"]})
                out.write(scored)
                batch.clear()

            for row in source.rows(shard["start"], shard["end"], at=shard.get("at")):
                if row.error:
                    errors += 1
                    err.write(json.dumps({"file": shard["file"], "line": row.line,
                                          "reason": row.error}) + "\n")
                    continue
                rows += 1
                batch.append(row)
                if len(batch) == cfg.batch_size:
                    flush()
            if batch:
                flush()
        record = {"name": shard["name"], "file": shard["file"], "start": shard["start"],
                  "end": shard["end"], "rows": rows, "error_rows": errors,
                  "part": _publish(part, shards.part_uri(output, shard["name"], fmt)),
                  "errors": (_publish(bad, shards.errors_uri(output, shard["name"]))
                             if errors else None),
                  "model_version": model["version"], "started": started}
    record["ended"] = time.time()
    record["seconds"] = record["ended"] - started
    storage.write_json(shards.record_uri(output, shard["name"]), record)
    return record


def _publish(path: Path, uri: str) -> dict:
    facts = {"uri": uri, "size": path.stat().st_size, "sha256": sha256_file(path)}
    storage.upload_file(path, uri)
    return facts
