"""Publish a scoring run: check that every shard is recorded and that the rows add up, then
write `{output}/_COMPLETE.json` and the run's `score/summary.json` (the bertflow page lists
these). Reads only small JSON records: it runs in the Airflow task process.

_COMPLETE.json holds the files (path, rows, size, sha256), the counts, the model version with
its lineage, and the inputs with their sha256: what a consumer needs to trust the output.
"""
from __future__ import annotations

from datetime import datetime, timezone

from tasks.errors import BertflowError
from tasks.io import storage
from tasks.io.uris import COMPLETE, join_uri
from tasks.runs.runlayout import RunContext
from tasks.scoring import shards
from tasks.scoring.plan import read_plan, read_score_config

SUMMARY = "summary.json"


def summary_uri(ctx: RunContext) -> str:
    return join_uri(ctx.step_uri("score"), SUMMARY)


def _relative(output: str, uri: str) -> str:
    return uri[len(output.rstrip("/")) + 1:]


def publish(ctx: RunContext) -> dict:
    cfg, plan = read_score_config(ctx), read_plan(ctx)
    output = plan["output_uri"]
    records = shards.published(output)
    missing = [s["name"] for s in plan["shards"] if s["name"] not in records]
    if missing:
        raise BertflowError(f"{output}: {len(missing)} shard(s) not scored ({missing[0]}, ...); "
                            "run the score task again: it redoes only those")
    files, error_files, rows, error_rows = [], [], 0, 0
    for shard in plan["shards"]:
        record = records[shard["name"]]
        if record["rows"] + record["error_rows"] != shard["end"] - shard["start"]:
            raise BertflowError(
                f"{shard['name']}: {record['rows']} rows scored and {record['error_rows']} "
                f"unreadable, but the plan gives it {shard['end'] - shard['start']} rows of "
                f"{shard['file']}; the input changed during the run? Start a new run")
        rows += record["rows"]
        error_rows += record["error_rows"]
        files.append({"path": _relative(output, record["part"]["uri"]), "rows": record["rows"],
                      "size": record["part"]["size"], "sha256": record["part"]["sha256"]})
        if record["errors"]:
            error_files.append({"path": _relative(output, record["errors"]["uri"]),
                                "rows": record["error_rows"],
                                "size": record["errors"]["size"],
                                "sha256": record["errors"]["sha256"]})
    if error_rows > cfg.max_error_rows:
        first = error_files[0]["path"]
        raise BertflowError(
            f"{error_rows} rows could not be scored, more than max_error_rows "
            f"{cfg.max_error_rows}: see {join_uri(output, first)} (file, line, reason); fix "
            "the input, or raise max_error_rows")
    started = min(r["started"] for r in records.values())
    ended = max(r["ended"] for r in records.values())
    model = plan["model"]
    complete = {
        "output_uri": output, "format": cfg.output_format, "files": files,
        "errors": error_files, "rows": rows, "error_rows": error_rows,
        "input_rows": plan["rows"], "inputs": plan["inputs"],
        "model": {"version": model["version"], "version_uri": model["version_uri"],
                  "task": model["task"]},
        "lineage": model["lineage"],
        "dag_id": ctx.dag_id, "run_id": ctx.run_id, "run_key": ctx.run_key,
        "published_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    storage.write_json(join_uri(output, COMPLETE), complete)
    summary = {"output_uri": output, "model_version": model["version"],
               "version_uri": model["version_uri"], "task": model["task"], "rows": rows,
               "error_rows": error_rows, "shards": len(files),
               "workers": plan["num_workers"], "seconds": round(ended - started, 3),
               "rows_per_second": round(rows / max(ended - started, 1e-9), 1),
               "input_uri": cfg.input_uri, "run_id": ctx.run_id,
               "published_at": complete["published_at"]}
    storage.write_json(summary_uri(ctx), summary)
    return summary
