"""Date placeholders in data and export URIs: resolved from the run's dates at validate,
rejected with the field's name when unknown, refused for a run without a logical date."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tasks.io import uri_templates
from tasks.config import parse_config
from tasks.errors import ConfigError

DAY = datetime(2026, 10, 3, tzinfo=timezone.utc)
DATES = uri_templates.RunDates(DAY, datetime(2026, 10, 2, tzinfo=timezone.utc), DAY)


def test_placeholders_resolve_from_the_run_dates():
    values = {"train_uri": "gs://b/reviews/{ds}/*.jsonl",
              "eval_uri": "s3://b/events/{data_interval_start:%Y/%m/%d}/",
              "export_uri": "gs://m/{ds_nodash}", "text_column": "{ds}"}
    out = uri_templates.resolve(values, DATES)
    assert out == {"train_uri": "gs://b/reviews/2026-10-03/*.jsonl",
                   "eval_uri": "s3://b/events/2026/10/02/", "export_uri": "gs://m/20261003",
                   "text_column": "{ds}"}  # only URI fields are templated
    assert uri_templates.resolve({"train_uri": "x/{logical_date}"}, DATES) == {
        "train_uri": "x/2026-10-03T00:00:00+00:00"}


@pytest.mark.parametrize("uri, message", [
    ("gs://b/{date}/x.tsv", "unknown placeholder {date}"),
    ("gs://b/{ds:%Y}/x.tsv", "{ds} takes no format"),
    ("gs://b/{ds/x.tsv", "expected '}'"),
    ("gs://b/{ds!r}/x.tsv", "unknown placeholder {ds}"),
])
def test_bad_placeholders_name_the_field(uri, message):
    with pytest.raises(ConfigError, match="config field 'train_uri'") as err:
        parse_config({"train_uri": uri})
    assert message in str(err.value)


def test_a_run_without_a_logical_date_cannot_use_one():
    with pytest.raises(ConfigError, match="'eval_uri'.*has no logical date"):
        uri_templates.resolve({"eval_uri": "gs://b/{ds}/"}, None)
    # Without placeholders no date is needed.
    assert uri_templates.resolve({"eval_uri": "gs://b/x/"}, None) == {"eval_uri": "gs://b/x/"}
