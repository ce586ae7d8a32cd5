"""Date placeholders in data and export URIs, so a scheduled or backfilled run reads its own
partition: `gs://bucket/reviews/{ds}/*.jsonl`, `s3://b/events/{data_interval_start:%Y/%m/%d}/`.

Syntax: Python format fields. `{ds}` (YYYY-MM-DD) and `{ds_nodash}` (YYYYMMDD) are the run's
logical date as Airflow names them; `{logical_date:FMT}`, `{data_interval_start:FMT}` and
`{data_interval_end:FMT}` take a strftime format (`{logical_date}` alone is ISO 8601). The
`validate` step resolves them and the run records only the resolved URIs (config.json, the
data manifest, the model card). An unknown placeholder fails `parse_config` naming the field.
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from datetime import datetime

from tasks.errors import ConfigError

# Fields whose value may hold placeholders.
# input_uri and output_uri: bert_batch_score's (tasks/score_config.py).
TEMPLATED_FIELDS = ("train_uri", "validation_uri", "test_uri", "eval_uri", "export_uri",
                    "input_uri", "output_uri")
DATE_NAMES = ("ds", "ds_nodash")
DATETIME_NAMES = ("logical_date", "data_interval_start", "data_interval_end")
NAMES = DATE_NAMES + DATETIME_NAMES


@dataclass(frozen=True)
class RunDates:
    logical_date: datetime
    data_interval_start: datetime
    data_interval_end: datetime


def placeholders(text: str, field: str) -> list[str]:
    """The placeholder names in `text`; ConfigError naming `field` for a malformed or unknown
    one."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as err:
        raise ConfigError(field, f"{text!r}: {err} (write placeholders as {{ds}} or "
                                 "{data_interval_start:%Y/%m/%d})") from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in NAMES or conversion:
            raise ConfigError(field, f"unknown placeholder {{{name}}} in {text!r}; use one "
                                     f"of {', '.join('{' + n + '}' for n in NAMES)}")
        if spec and name in DATE_NAMES:
            raise ConfigError(field, f"{{{name}}} takes no format; use "
                                     f"{{logical_date:{spec}}}")
        names.append(name)
    return names


def check(values: dict) -> None:
    """Raise for a bad placeholder in any templated field of a config mapping."""
    for field in TEMPLATED_FIELDS:
        if values.get(field):
            placeholders(values[field], field)


def resolve(values: dict, dates: RunDates | None) -> dict:
    """A copy of `values` with every templated field resolved for the run's dates. A run
    without a logical date (a manual run triggered without one) gets a clear error when a
    field uses a placeholder."""
    out = dict(values)
    for field in TEMPLATED_FIELDS:
        text = out.get(field)
        if not text or not placeholders(text, field):
            continue
        if dates is None:
            raise ConfigError(field, f"{text!r} uses a date placeholder but this run has no "
                                     "logical date; trigger it with a logical date, or "
                                     "write the date into the URI")
        day = dates.logical_date
        out[field] = text.format(ds=day.strftime("%Y-%m-%d"), ds_nodash=day.strftime("%Y%m%d"),
                                 logical_date=_Date(day),
                                 data_interval_start=_Date(dates.data_interval_start),
                                 data_interval_end=_Date(dates.data_interval_end))
    return out


class _Date:
    """A datetime whose empty format is ISO 8601 (str(datetime) has a space in it)."""

    def __init__(self, value: datetime):
        self.value = value

    def __format__(self, spec: str) -> str:
        return self.value.strftime(spec) if spec else self.value.isoformat()
