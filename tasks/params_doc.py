"""docs/params.md, the Params reference, generated from RunConfig (`tasks.params_form.
param_schemas()`).

    .venv/bin/python -m tasks.params_doc           # rewrite docs/params.md
    .venv/bin/python -m tasks.params_doc --check   # exit 1 if docs/params.md is stale

Titles, types, defaults, descriptions and ranges are the trigger form's own, in its sections and
order, so the page cannot drift from the form, the CLI or validation (tests/test_config.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tasks.config import PROJECT_ROOT, RunConfig
from tasks.params_form import (FIRST_SECTION, SCORE_SECTIONS, SECTIONS, param_schemas,
                               score_param_schemas)
from tasks.score_config import SHARED_FIELDS, ScoreConfig

DOC = PROJECT_ROOT / "docs" / "params.md"

HEADER = """\
# Params

Generated from `tasks/config.py` and `tasks/params_form.py` by `.venv/bin/python -m
tasks.params_doc`; do not edit by hand (`tests/test_config.py` fails when this page is stale).

Every field of `RunConfig` is a DAG Param (the trigger form) and an `init-run` CLI flag
(`--per-replica-batch-size 32`, or `--per_replica_batch_size 32`). Lists take `a,b` or a JSON
list, objects a JSON object. Empty optional fields mean "not set".

The trigger form shows them in these sections, in this order. The first, Airflow's "{first}"
box, is open when the form appears and holds what a first-time user changes; the others start
closed, and the "(advanced)" ones can stay at their defaults.
"""

# JSON-schema range keywords -> how the page writes them.
RANGES = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
          ("exclusiveMaximum", "<"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    kinds = schema.get("type", "")
    return "/".join(kinds) if isinstance(kinds, list) else kinds


SCORE_HEADER = """
# bert_batch_score Params

The batch-scoring DAG's Params (docs/scoring.md), from `ScoreConfig` in `tasks/score_config.py`;
also `python -m tasks init-score` flags. Those marked "as bert_finetune" are RunConfig's own
fields, described above.
"""


def _default(name: str, value: Any, model=RunConfig) -> str:
    field = model.model_fields[name]
    if field.default_factory is not None:  # depends on the environment: say how
        doc = (field.default_factory.__doc__ or field.default_factory.__name__).strip()
        return _cell(doc.splitlines()[0])
    if value in (None, "", [], {}):
        return "empty"
    if isinstance(value, str) and value.startswith(str(PROJECT_ROOT) + "/"):
        value = value[len(str(PROJECT_ROOT)) + 1:]  # a path in the checkout, as users see it
    shown = value if isinstance(value, str) else json.dumps(value)
    return f"`{_cell(shown)}`"


def _what(schema: dict[str, Any]) -> str:
    parts = [schema["title"].rstrip(".") + "."]
    if schema.get("description"):
        parts.append(schema["description"])
    ranges = [f"{sign} {schema[key]}" for key, sign in RANGES if key in schema]
    if ranges:
        parts.append(f"Range: {', '.join(ranges)}.")
    return _cell(" ".join(parts))


def render() -> str:
    schemas = param_schemas()
    out = [HEADER.format(first=FIRST_SECTION).rstrip("\n")]
    for section, names in SECTIONS.items():
        out += [f"\n## {section}\n", "| Param | type | default | what it does |",
                "|---|---|---|---|"]
        out += [f"| `{n}` | {_type(schemas[n])} | {_default(n, schemas[n]['default'])} | "
                f"{_what(schemas[n])} |" for n in names]
    scoring = score_param_schemas()
    out.append(SCORE_HEADER.rstrip("\n"))
    for section, names in SCORE_SECTIONS.items():
        out += [f"\n### {section}\n", "| Param | type | default | what it does |",
                "|---|---|---|---|"]
        out += [f"| `{n}` | {_type(scoring[n])} | "
                f"{_default(n, scoring[n]['default'], ScoreConfig)} | "
                + ("as bert_finetune |" if n in SHARED_FIELDS else f"{_what(scoring[n])} |")
                for n in names]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/params.md is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC.relative_to(PROJECT_ROOT)} is stale: run .venv/bin/python -m "
                  "tasks.params_doc", file=sys.stderr)
            return 1
        return 0
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(text)
    print(DOC.relative_to(PROJECT_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
