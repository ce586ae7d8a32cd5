"""The geometry of the bertflow page's SVG charts, as data for templates/charts.html: where
the axes, ticks, polylines and heat-map cells go. No markup here; the template draws it and
escapes every text.

- `line_chart`: one or more series (a run's loss, accuracy, learning rate or validation metric
  against step) on shared axes, 5 ticks on each, and an optional marked step.
- `confusion`: a confusion matrix as a heat map (rows: true label, columns: predicted),
  shaded by the share of each true label's examples.
- `predicted_vs_true`: a regression's evaluation as points (mean true, mean predicted) per
  bin of the true value, sized by the bin's rows, over the diagonal of perfect predictions.
"""
from __future__ import annotations

import math
from typing import Any

from bertflow_ui.formatting import fmt

# Margins of a line chart's plot area, in px: room for the y tick labels, the title and the
# x tick labels with the axis name.
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 40
TICKS = 5

# The run page's three series: (history.json key, title, colour). Colours: Airflow's red.600,
# blue.600 and green.600 in sRGB (its theme gives them in oklch); templates/bertflow.css
# takes the lighter 400s in dark mode.
RUN_SERIES = (("loss", "training loss", "#e7000b"),
              ("accuracy", "training accuracy", "#155dfc"),
              # the other tasks' training metrics (tasks/task_kinds.py): at most one is there
              ("label_accuracy", "training label accuracy", "#155dfc"),
              ("mse", "training MSE", "#155dfc"),
              ("learning_rate", "learning rate", "#007a33"))

VALIDATION_COLOR = "#9810fa"  # Airflow's purple.600, beside the training series

# Tableau 10: distinct hues for the runs' curves and legend on the compare page (cycled
# beyond 10 runs).
RUN_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
              "#7f7f7f", "#bcbd22", "#17becf"]


def run_color(i: int) -> str:
    return RUN_COLORS[i % len(RUN_COLORS)]


Line = tuple[str | None, str, list[tuple[float, float]]]  # (run, colour, points)


def line_chart(lines: list[Line], title: str, series: str, width: int = 420,
               height: int = 240, mark: tuple[float, str] | None = None
               ) -> dict[str, Any] | None:
    """One polyline per (run, colour, points) on shared axes; None when no line has a point.
    A named run's line carries its name (the template writes it as `data-run`). `mark`:
    (step, what it is) drawn as a vertical line, e.g. the best validation step."""
    lines = [line for line in lines if line[2]]
    if not lines:
        return None
    xs = [p[0] for _, _, points in lines for p in points]
    ys = [p[1] for _, _, points in lines for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - LEFT - RIGHT, height - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return TOP + ph - (y - y0) / (y1 - y0) * ph

    steps = [i / (TICKS - 1) for i in range(TICKS)]
    drawn = []
    for run, color, points in lines:
        lx, ly = points[-1]
        drawn.append({
            "run": run, "color": color,
            "points": " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points),
            "end": {"x": f"{sx(lx):.1f}", "y": f"{sy(ly):.1f}"},
            "tip": f"{run + ', ' if run is not None else ''}step {lx:.0f}: {fmt(ly)}"})
    return {
        "title": title, "series": series, "width": width, "height": height,
        "left": LEFT, "top": TOP, "right": LEFT + pw, "bottom": TOP + ph,
        "center": LEFT + pw / 2,
        "y_ticks": [{"y": f"{sy(y0 + (y1 - y0) * t):.1f}",
                     "text_y": f"{sy(y0 + (y1 - y0) * t) + 4:.1f}",
                     "label": fmt(y0 + (y1 - y0) * t, 3)} for t in steps],
        "x_ticks": [{"x": f"{sx(x0 + (x1 - x0) * t):.1f}", "label": f"{x0 + (x1 - x0) * t:.0f}"}
                    for t in steps],
        "lines": drawn,
        "mark": ({"x": f"{sx(mark[0]):.1f}", "tip": mark[1]}
                 if mark is not None and x0 <= mark[0] <= x1 else None),
    }


def history_points(history: list[dict], key: str) -> list[tuple[float, float]]:
    """(step, value) of every history.json record with an int step and a finite number."""
    return [(float(r["step"]), float(r[key])) for r in history
            if isinstance(r, dict) and isinstance(r.get("step"), int)
            and isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
            and math.isfinite(r[key])]


def run_charts(history: list[dict], meta: dict | None = None) -> list[dict[str, Any]]:
    """The run page's charts: loss, accuracy and learning rate against step, then the
    validation metric (history.json's `validation`, `best`: tasks/training/validation.py)
    with its best step marked."""
    charts = [line_chart([(None, color, history_points(history, key))], title, key)
              for key, title, color in RUN_SERIES]
    meta = meta if isinstance(meta, dict) else {}
    best = meta.get("best") if isinstance(meta.get("best"), dict) else {}
    metric = best.get("metric")
    validation = meta.get("validation")
    if isinstance(metric, str) and isinstance(validation, list):
        step = best.get("best_step")
        mark = None
        if isinstance(step, int) and step >= 0:
            mark = (float(step), f"best: step {step}, {metric} {fmt(best.get('best_value'))}"
                                 + (" (exported)" if best.get("exported") == "best" else ""))
        charts.append(line_chart([(None, VALIDATION_COLOR,
                                   history_points(validation, metric))],
                                 f"validation {metric}", "validation", mark=mark))
    return [c for c in charts if c is not None]


def predicted_vs_true(binned: Any, size: int = 260) -> dict[str, Any] | None:
    """The geometry of evaluate's `binned` summary (tasks/task_kinds.py binned): one point
    per non-empty bin at (mean true, mean predicted), radius growing with its rows, and the
    diagonal; None for anything else (draw nothing rather than fail)."""
    rows = binned.get("rows") if isinstance(binned, dict) else None
    points = [r for r in rows or [] if isinstance(r, dict) and r.get("count")
              and all(isinstance(r.get(k), (int, float)) and math.isfinite(r[k])
                      for k in ("mean_true", "mean_predicted"))]
    if not points:
        return None
    values = [r[k] for r in points for k in ("mean_true", "mean_predicted")]
    lo, hi = min(values), max(values)
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    side = size - LEFT - RIGHT

    def at(value: float, flip: bool = False) -> float:
        share = (value - lo) / (hi - lo)
        return TOP + side * (1 - share) if flip else LEFT + side * share

    most = max(r["count"] for r in points)
    steps = [i / (TICKS - 1) for i in range(TICKS)]
    return {
        "width": size, "height": TOP + side + BOTTOM, "left": LEFT, "top": TOP,
        "right": LEFT + side, "bottom": TOP + side, "center": LEFT + side / 2,
        "diagonal": {"x1": at(lo), "y1": at(lo, True), "x2": at(hi), "y2": at(hi, True)},
        "ticks": [{"x": f"{at(lo + (hi - lo) * t):.1f}", "y": f"{at(lo + (hi - lo) * t, True):.1f}",
                   "label": fmt(lo + (hi - lo) * t, 3)} for t in steps],
        "points": [{"x": f"{at(r['mean_true']):.1f}", "y": f"{at(r['mean_predicted'], True):.1f}",
                    "r": f"{3 + 5 * math.sqrt(r['count'] / most):.1f}",
                    "tip": f"{r['count']} rows, true {fmt(r['mean_true'])}, predicted "
                           f"{fmt(r['mean_predicted'])}"} for r in points]}


def confusion(matrix: Any, labels: list[str]) -> dict[str, Any] | None:
    """The heat map of a confusion matrix, or None for anything the evaluate step does not
    write (draw nothing rather than fail): cells with their count and share of the row."""
    n = len(labels)
    if not n or not isinstance(matrix, list) or len(matrix) != n or any(
            not isinstance(row, list) or len(row) != n or
            not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in row)
            for row in matrix):
        return None
    cell = max(22, min(64, 520 // n))
    shown = [lb if len(lb) <= 18 else lb[:17] + "…" for lb in labels]
    left = min(170, 16 + 7 * max(len(s) for s in shown)) + 24
    top = min(150, 16 + 6 * max(len(s) for s in shown)) + 24
    size = cell * n
    axis_labels = [{"full": label, "short": short,
                    "row_y": f"{top + cell * i + cell / 2 + 4:.1f}",
                    "col_x": f"{left + cell * i + cell / 2:.1f}"}
                   for i, (label, short) in enumerate(zip(labels, shown))]
    cells = []
    for i, row in enumerate(matrix):
        total = sum(row) or 1
        for j, count in enumerate(row):
            share = count / total
            x, y = left + cell * j, top + cell * i
            cells.append({"x": x, "y": y, "count": count, "share": share,
                          "percent": round(share * 100), "true": labels[i],
                          "predicted": labels[j], "strong": share > 0.55,
                          "text_x": x + cell / 2, "text_y": y + cell / 2 + 4})
    return {"width": left + size + 16, "height": top + size + 16, "left": left, "top": top,
            "cell": cell, "middle_x": left + size / 2, "middle_y": top + size / 2,
            "labels": axis_labels, "cells": cells}
