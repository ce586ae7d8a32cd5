"""The file of a shard's scored rows, in the run's output_format: JSON Lines, or Parquet
through pyarrow (imported only for Parquet: the JSON path and the Airflow tasks never load it).

Both take rows as the score step makes them (`file`, `line`, `id` when id_column is set, the
task's outputs, `model_version`) and write to a local file, which the step then publishes
whole (tasks/steps/score.py). A Parquet part has one schema per task, the same for every
shard of a run (`arrow_schema`), so the parts read back as one table; rows are buffered up
to ROW_GROUP_ROWS and written as one row group, which bounds the writer's memory.
"""
from __future__ import annotations

import json

from tasks.errors import BertflowError

FORMATS = ("jsonl", "parquet")
ROW_GROUP_ROWS = 8192
METADATA_KEY = b"bertflow"  # the schema's metadata: the model version, its URI and task


def suffix(output_format: str) -> str:
    return f".{output_format}"


class JsonLinesPart:
    """One JSON object per row."""

    def __init__(self, path, task: str, has_id: bool, model: dict):
        self._file = open(path, "w", encoding="utf-8")

    def write(self, rows: list[dict]) -> None:
        self._file.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))

    def close(self) -> None:
        self._file.close()


def arrow_schema(task: str, has_id: bool, model: dict):
    """The Parquet columns of a task's rows, typed as the serving signature returns them
    (tasks/task_kinds.py serving_outputs: float32 probabilities and scores, int64 offsets)."""
    import pyarrow as pa

    probabilities = ("probabilities", pa.list_(pa.float32()))
    outputs = {
        "classification": [("label", pa.string()), probabilities],
        "multi_label": [("labels", pa.list_(pa.string())), probabilities],
        "regression": [("score", pa.float32())],
        "token_classification": [("entities", pa.list_(pa.struct([
            ("entity_group", pa.string()), ("start", pa.int64()), ("end", pa.int64()),
            ("word", pa.string()), ("score", pa.float32())])))],
    }
    if task not in outputs:
        raise BertflowError(f"output_format parquet has no columns for task {task}; use "
                            "output_format jsonl")
    fields = [("file", pa.string()), ("line", pa.int64())]
    fields += [("id", pa.string())] if has_id else []
    fields += outputs[task] + [("model_version", pa.string())]
    about = {k: model.get(k) for k in ("version", "version_uri", "task")}
    return pa.schema(fields, metadata={METADATA_KEY: json.dumps(about).encode()})


class ParquetPart:
    """Row groups of up to ROW_GROUP_ROWS rows, zstd-compressed."""

    def __init__(self, path, task: str, has_id: bool, model: dict):
        import pyarrow.parquet as pq

        self.schema = arrow_schema(task, has_id, model)
        self._writer = pq.ParquetWriter(str(path), self.schema, compression="zstd")
        self._rows: list[dict] = []

    def write(self, rows: list[dict]) -> None:
        if rows and set(rows[0]) != set(self.schema.names):  # a new served output is not
            raise BertflowError(  # dropped silently
                f"scored rows have the fields {sorted(rows[0])}, the Parquet schema "
                f"{self.schema.names}; update tasks/scoring/parts.py arrow_schema")
        self._rows += rows
        if len(self._rows) >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._rows:
            self._writer.write_table(pa.Table.from_pylist(self._rows, schema=self.schema))
            self._rows = []

    def close(self) -> None:
        self._flush()
        self._writer.close()


def part_writer(output_format: str, path, task: str, has_id: bool, model: dict):
    writer = {"jsonl": JsonLinesPart, "parquet": ParquetPart}[output_format]
    return writer(path, task, has_id, model)
