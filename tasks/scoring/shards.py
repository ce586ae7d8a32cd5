"""Where a scoring run's shards are published, and how a published one is recognised.

Under the run's output folder `{output_uri}/{run}/`:
    part-NNNNN.jsonl        the scored rows of shard NNNNN, one JSON object per input row
                            (output_format parquet: part-NNNNN.parquet, tasks/scoring/parts.py)
    errors/part-NNNNN.jsonl its rows that could not be scored (file, line, reason); only
                            when there are any
    _shards/part-NNNNN.json its record: rows, error rows, sha256 and size of each file,
                            start and end times. Written last: a shard is published when its
                            record exists, so a retried worker skips it and redoes only
                            shards without one (their files are overwritten whole).
    _COMPLETE.json          written by the publish task once every shard is (tasks/scoring/
                            publish.py)
"""
from __future__ import annotations

from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.scoring.parts import suffix

RECORDS = "_shards"
ERRORS = "errors"


def part_uri(output: str, name: str, output_format: str = "jsonl") -> str:
    return join_uri(output, name + suffix(output_format))


def errors_uri(output: str, name: str) -> str:
    return join_uri(output, ERRORS, f"{name}.jsonl")


def record_uri(output: str, name: str) -> str:
    return join_uri(output, RECORDS, f"{name}.json")


def published(output: str) -> dict[str, dict]:
    """name -> record of every published shard."""
    out = {}
    for uri in storage.list_uris(join_uri(output, RECORDS)):
        if uri.endswith(".json"):
            name = uri.rsplit("/", 1)[-1][:-len(".json")]
            out[name] = storage.read_json(uri)
    return out
