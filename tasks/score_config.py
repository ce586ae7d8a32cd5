"""The typed configuration of a batch-scoring run (`bert_batch_score`), beside RunConfig.

`ScoreConfig` is the source of the scoring DAG's Params (and so its trigger form), the
`python -m tasks init-score` flags and validation. The fields it shares with training (the
text columns, the model store, the worker backend and its settings, storage connections)
are RunConfig's own fields, taken from it by name, not declared again: a change there shows
here. `run_config()` turns the worker settings into the RunConfig the backends take.
"""
from __future__ import annotations

import os
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, \
    model_validator

from tasks.config import DEMO_DIR, RunConfig, _error_from_validation, parse_config, \
    unset_empty
from tasks.io import uri_templates
from tasks.io.uris import join_uri
from tasks.task_kinds import KINDS

# RunConfig fields a scoring run takes as they are.
SHARED_FIELDS = (
    "file_format", "text_column", "text_pair_column", "model_name", "export_uri",
    "num_workers", "provisioner", "accelerator", "worker_image", "image_registry",
    "accelerator_type", "machine_type", "worker_cpu", "worker_memory", "k8s_conn_id",
    "k8s_namespace", "service_account", "image_pull_secrets", "node_selector", "tolerations",
    "gcp_project", "gcp_region", "network", "worker_timeout_minutes",
    "schedule_timeout_seconds", "capacity", "reservation", "k8s_platform", "max_preemptions",
    "artifact_root", "gcp_conn_id", "aws_conn_id",
)
# Of those, what the worker backends read (the rest is scoring's own business).
WORKER_FIELDS = tuple(f for f in SHARED_FIELDS if f not in (
    "file_format", "text_column", "text_pair_column"))


def default_input_uri() -> str:
    """`$BERTFLOW_SCORING_INPUT_URI`, else the demo's eval.tsv"""
    return os.environ.get("BERTFLOW_SCORING_INPUT_URI", str(DEMO_DIR / "eval.tsv"))


class _ScoreFields(BaseModel):
    """Scoring's own fields (the shared ones are added from RunConfig below)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    input_uri: str = Field(
        default_factory=default_input_uri, title="Input data", min_length=1,
        description="The texts to score: a CSV, TSV, JSON Lines or Parquet (.parquet) "
                    "file, a folder ending in / "
                    "(every data file under it) or a glob such as gs://bucket/in/*.jsonl; "
                    "local, gs:// or s3://. May hold the run's date: "
                    "gs://bucket/tickets/{ds}/ (backfills). A bertflow-scoring-data asset "
                    "event's extra input_uri replaces it.")
    id_column: Optional[str] = Field(
        default=None, title="Id column",
        description="A column copied to every output row as id. Empty: rows are named by "
                    "their file and line.")
    model: str = Field(
        default="champion", title="Model", min_length=1,
        description="champion: the current champion of model_name (CHAMPION.json under "
                    "export_uri); or a version URI, {export_uri}/{model_name}/{version}.")
    expected_task: Optional[Literal[tuple(KINDS)]] = Field(  # type: ignore[valid-type]
        default=None, title="Expected task",
        description="Refuse a model version of another task (its outputs would not be what "
                    "the consumers read). Empty: any task.")
    output_uri: str = Field(
        default="", title="Output location",
        description="Scores go to {output_uri}/{run}/: part-NNNNN.jsonl (or .parquet) "
                    "files, errors/ and _COMPLETE.json. Must not be inside the input's "
                    "folder. May hold the run's date. Empty: {artifact_root}/scores.")
    output_format: Literal["jsonl", "parquet"] = Field(
        default="jsonl", title="Output format",
        description="jsonl: one JSON object per input row. parquet: Parquet files (pyarrow, "
                    "zstd), typed columns per task (docs/scoring.md); the errors files stay "
                    "JSON Lines.")
    batch_size: int = Field(default=64, ge=1, le=4096, title="Scoring batch",
                            description="Texts per call of the serving signature.")
    shard_rows: int = Field(
        default=10000, ge=1, le=10_000_000, title="Rows per shard",
        description="Input rows per output shard: the unit of work of a worker, published "
                    "atomically and skipped when a retried worker finds it done.")
    peer_wait_seconds: int = Field(
        default=600, ge=1, le=86400, title="Wait for a stalled worker (s)",
        description="Worker 0, done with its own shards, fails the try when no worker has "
                    "published a shard for this long (or 4 times the slowest shard, if "
                    "longer), naming the missing shards: a worker that hangs or died where "
                    "the backend cannot tell. The task's retry scores only those shards. "
                    "Must cover a worker's start (loading the model).")
    max_error_rows: int = Field(
        default=1000, ge=0, title="Most unreadable rows",
        description="Rows that cannot be scored (bad UTF-8, an empty text, a malformed "
                    "line) go to the errors files with file, line and reason; the run fails "
                    "when there are more than this many.")

    @model_validator(mode="after")
    def _check_combinations(self):
        # The text columns are RunConfig's, added by create_model below.
        text, pair = self.text_column, self.text_pair_column
        if pair is not None and pair == text:
            raise ValueError("text_pair_column must differ from text_column")
        if self.file_format == "conll":
            raise ValueError("file_format conll holds tagged tokens; score raw texts from a "
                             "csv, tsv or jsonl file (entity models find the entities)")
        if self.id_column is not None and self.id_column in (text, pair):
            raise ValueError("id_column must differ from the text columns")
        if self.provisioner == "tpu_vm":
            raise ValueError("provisioner tpu_vm is not wired for scoring (its VM is made and "
                             "removed by bert_finetune's provision and release tasks); use "
                             "local, kubernetes or vertex_ai")
        return self


ScoreConfig = create_model(
    "ScoreConfig", __base__=_ScoreFields, __doc__="Every knob of one batch-scoring run.",
    **{name: (RunConfig.model_fields[name].annotation, RunConfig.model_fields[name])
       for name in SHARED_FIELDS})


def resolved_output_uri(cfg) -> str:
    return cfg.output_uri or join_uri(cfg.artifact_root, "scores")


def run_config(cfg) -> RunConfig:
    """The RunConfig the worker backends and the run folder take: scoring's worker settings,
    RunConfig's defaults for the rest (every RunConfig check runs on them)."""
    return parse_config({name: getattr(cfg, name) for name in WORKER_FIELDS})


def parse_score_config(values: dict[str, Any]):
    """Validate a mapping (Params, a JSON file, CLI flags) into a ScoreConfig; "" and null
    mean "not set", as in tasks.config.parse_config. Raises ConfigError naming the field."""
    cleaned = unset_empty(ScoreConfig, values)
    try:
        cfg = ScoreConfig.model_validate(cleaned)
    except ValidationError as err:
        raise _error_from_validation(err) from None
    uri_templates.check(cleaned)
    run_config(cfg)  # the worker settings' own checks (capacity, ...) name their field
    return cfg
