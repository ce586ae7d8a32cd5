"""Numbers and durations as the bertflow page prints them (plain text: the templates escape)."""
from __future__ import annotations

import json
from typing import Any

MISSING = "–"


def fmt(value: Any, digits: int = 4) -> str:
    """A table cell's value: floats to `digits` significant places (scientific when tiny or
    huge), None as a dash, anything else as its text."""
    if value is None:
        return MISSING
    if isinstance(value, float):
        if abs(value) < 1e-2 or abs(value) >= 1e4:
            return f"{value:.{digits}g}"
        return f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return str(value)


def exact(value: Any) -> str:
    """A config or metric value, exact: floats as their shortest round-trip repr (two values
    that differ never read the same), containers as JSON, the rest as `fmt` prints them."""
    if isinstance(value, (dict, list, float)):
        return json.dumps(value)
    return fmt(value)


def duration(seconds: Any) -> str:
    if seconds is None:
        return MISSING
    seconds = float(seconds)
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
