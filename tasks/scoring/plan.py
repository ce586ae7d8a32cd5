"""A scoring run's checks and plan, made before any worker starts (the DAG's validate task,
no TensorFlow): which model version, which files, which shards.

Refused here, each naming what to change:
- an input file without the text (pair, id) column: the file and the columns it has;
- a model version without _COMPLETE.json, or of a task other than expected_task, or whose
  inputs (one text or a pair) differ from the configured columns;
- an output location inside the input's folder (the next run would score its own output).

The plan cuts each file into row ranges of shard_rows records (`tasks.io.scoring_reader`
counts them, hashing each file as it streams by, and notes the byte offset and line where
each range begins, so that a worker reads only its own; a Parquet file's shards start at row
numbers, tasks/io/scoring_parquet.py): shard k is `part-{k:05d}`, scored by
worker k mod num_workers. It is written to `{run}/score/plan.json` with the model's lineage.
"""
from __future__ import annotations

import json
import os

from tasks.errors import BertflowError, ConfigError, DataError
from tasks.io import storage, text_readers
from tasks.io.scoring_parquet import open_score_file
from tasks.io.scoring_reader import PARQUET_EXTENSIONS, ScoreFile
from tasks.io.uris import join_uri
from tasks.runs import lineage
from tasks.runs.runlayout import CHAMPION, RunContext
from tasks.score_config import resolved_output_uri, run_config

PLAN = "plan.json"
SCORE_CONFIG = "score_config.json"


def plan_uri(ctx: RunContext) -> str:
    return join_uri(ctx.step_uri("score"), PLAN)


def shard_name(index: int) -> str:
    return f"part-{index:05d}"


def resolve_model(cfg) -> dict:
    """{"version", "version_uri", "task", "has_pair", "lineage"} of the model to score with:
    the champion's pointer followed, or the version URI given; ConfigError('model' or
    'expected_task' or 'text_pair_column') when it cannot serve this run."""
    if cfg.model == "champion":
        pointer = join_uri(run_config(cfg).resolved_export_uri(), cfg.model_name, CHAMPION)
        if not storage.exists(pointer):
            raise ConfigError("model", f"model_name {cfg.model_name} has no champion yet (no "
                                       f"{pointer}); promote a model with bert_finetune, or "
                                       "set model to a version URI")
        version_uri = storage.read_json(pointer)["version_uri"]
    else:
        version_uri = cfg.model.rstrip("/")
    if not storage.is_complete(version_uri):
        raise ConfigError("model", f"{version_uri} is not a completely published model "
                                   f"version (no {storage.COMPLETE}); name a version that "
                                   "bert_finetune's export step finished")
    record = lineage.read(version_uri) or {}
    config = record.get("config") or {}
    task = config.get("task", "classification")
    if cfg.expected_task and task != cfg.expected_task:
        raise ConfigError("expected_task", f"{version_uri} is a {task} model, not "
                                           f"{cfg.expected_task}; name a {cfg.expected_task} "
                                           "model, or clear expected_task")
    has_pair = bool(config.get("text_pair_column"))
    if has_pair != (cfg.text_pair_column is not None):
        wants = "a pair of texts" if has_pair else "one text"
        raise ConfigError("text_pair_column", f"{version_uri} takes {wants} per row; "
                                              + ("set text_pair_column" if has_pair else
                                                 "clear text_pair_column"))
    return {"version": record.get("version") or version_uri.rsplit("/", 1)[-1],
            "version_uri": version_uri, "task": task, "has_pair": has_pair,
            "lineage": record}


def _folder(uri: str) -> str:
    """A comparable folder form: absolute for local paths, with one trailing '/'."""
    if storage.is_local(uri):
        uri = os.path.abspath(str(storage.local_path(uri)))
    return uri.rstrip("/") + "/"


def input_folder(input_uri: str) -> str | None:
    """The folder whose files an input names: a prefix itself, a glob's folder before its
    first wildcard; None for a single file (its folder is not read)."""
    if input_uri.endswith("/"):
        return _folder(input_uri)
    wild = [i for i in (input_uri.find("*"), input_uri.find("?")) if i >= 0]
    if wild:
        return _folder(input_uri[:min(wild)].rpartition("/")[0] or ".")
    return None


def check_output(cfg) -> str:
    """The output folder, refused when the input would read it, or when remote workers
    could not reach it or the input."""
    output = resolved_output_uri(cfg)
    if cfg.provisioner != "local":
        for field, uri in (("input_uri", cfg.input_uri), ("output_uri", output)):
            if storage.is_local(uri):
                raise ConfigError(field, f"{uri} is a local path, which remote workers "
                                         f"({cfg.provisioner}) cannot see; use a gs:// or "
                                         "s3:// location")
    folder = input_folder(cfg.input_uri)
    if folder and _folder(output).startswith(folder):
        raise ConfigError("output_uri", f"{output} is inside the input's folder {folder}: the "
                                        "next run would score its own output; write it "
                                        "elsewhere")
    return output


def sources(cfg) -> list[ScoreFile]:
    files = text_readers.data_files(cfg.input_uri, cfg.file_format, also=PARQUET_EXTENSIONS)
    return [open_score_file(uri, cfg.file_format, cfg.text_column, cfg.text_pair_column,
                            cfg.id_column, every=cfg.shard_rows) for uri in files]


def make_plan(cfg, ctx: RunContext) -> dict:
    """Every check, then the plan (files read once, streamed); written to the run folder."""
    output = check_output(cfg)
    model = resolve_model(cfg)
    files = sources(cfg)
    for source in files:  # the header of each first: a wrong column fails in seconds
        source.check_columns()
    shards, inputs = [], []
    for source in files:
        for _ in source.rows(0, 0):  # counts, hashes and notes where each shard begins
            pass
        inputs.append({"uri": source.uri, "records": source.records, "sha256": source.sha256})
        for at in source.starts:
            shards.append({"name": shard_name(len(shards)), "index": len(shards),
                           "file": source.uri, "start": at["index"],
                           "end": min(at["index"] + cfg.shard_rows, source.records),
                           "at": at})
    if not shards:
        raise DataError(cfg.input_uri, "no rows to score", hint="check input_uri")
    plan = {"output_uri": join_uri(output, ctx.run_key), "model": model, "inputs": inputs,
            "rows": sum(f["records"] for f in inputs), "shards": shards,
            "output_format": cfg.output_format,
            "num_workers": min(cfg.num_workers, len(shards))}
    _drop_stale_output(ctx, plan)
    storage.write_json(join_uri(ctx.run_uri, SCORE_CONFIG), json.loads(cfg.model_dump_json()))
    storage.write_json(plan_uri(ctx), plan)
    return plan


def _drop_stale_output(ctx: RunContext, plan: dict) -> None:
    """A re-run of validate in a run folder (a cleared task) whose input, model, shards or
    output format changed: the published shards of the old plan are not this plan's, so
    they go (a retried worker would otherwise skip them)."""
    uri = plan_uri(ctx)
    if not storage.exists(uri):
        return
    old = storage.read_json(uri)
    same = all(old.get(k) == plan[k] for k in ("output_uri", "inputs", "shards")) and \
        old.get("output_format", "jsonl") == plan["output_format"] and \
        (old.get("model") or {}).get("version_uri") == plan["model"]["version_uri"]
    if not same:
        storage.delete_prefix(old.get("output_uri") or plan["output_uri"])


def read_plan(ctx: RunContext) -> dict:
    uri = plan_uri(ctx)
    if not storage.exists(uri):
        raise BertflowError(f"{uri}: no scoring plan; run the validate task first")
    return storage.read_json(uri)


def read_score_config(ctx: RunContext):
    from tasks.score_config import parse_score_config

    return parse_score_config(storage.read_json(join_uri(ctx.run_uri, SCORE_CONFIG)))
