"""The Jinja2 environment of the bertflow page: templates/*.html, autoescaped.

Every value a template prints is escaped unless it is a `Markup` object, and nothing here
builds one: stored text (labels, run ids, URIs, config values) is data, never markup. Filters:
`fmt` (numbers as table cells), `exact` (a value exactly, for the compare page), `duration`,
`seg` (one URL path segment or query value, percent-encoded).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from bertflow_ui.formatting import duration, exact, fmt

TEMPLATES = Path(__file__).resolve().parent / "templates"


def segment(value: Any) -> str:
    """One path segment or query value of a link: every reserved character percent-encoded."""
    return quote(str(value), safe="")


env = Environment(
    loader=FileSystemLoader(TEMPLATES),
    # .html and .svg templates escape what they print; the stylesheet prints nothing.
    autoescape=select_autoescape(enabled_extensions=("html", "svg"), default=True,
                                 default_for_string=True),
    undefined=StrictUndefined,  # a misspelt name fails the test that renders it, not silently
    trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
env.filters.update(fmt=fmt, exact=exact, duration=duration, seg=segment)


def render(template: str, **context: Any) -> str:
    return env.get_template(template).render(**context)
