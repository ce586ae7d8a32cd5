"""Airflow plugin: the "bertflow" page, mounted by the api-server at /bertflow/ and linked from
the UI's navigation bar.

- `/bertflow/`: models (complete versions per model name, the champion marked, metrics, model
  cards) and the experiments table (one row per run folder, grouped by experiment; `?sort=`
  a column, `&order=asc|desc`).
- `/bertflow/runs/{dag_id}/{run_key}`: one run: key config, training curves (loss, accuracy,
  learning rate against step, from train/history.json) and the confusion matrix as inline SVG,
  per-class metrics and the command that opens the run's TensorBoard logs.
- `/bertflow/runs/{dag_id}/{run_key}/logs/{step}/{role}-{index}.log`: a worker's log, as kept
  in the run folder (tasks/provision/worker_logs.py); the run page links every one.
- `/bertflow/models/{model}/{version}/card[?location={location_id}]`: a version's model card,
  from `{artifact_root}/models` or, with `location`, from another export location.
- `/bertflow/models/{model}/{version}[?location=...]`: a version's lineage (lineage.json: data
  URIs and hashes, token cache key, base checkpoint, code version, DAG run, metrics, config).
- `/bertflow/data?q=...`: the versions whose data has that sha256, URI (or URI part) or token
  cache key: "which versions came from this data".
- `/bertflow/compare?run={dag_id}/{run_key}&run=...`: two or more runs side by side (the
  config fields and metrics that differ, overlaid curves, each confusion matrix;
  tasks.runs.compare), from the index's checkboxes or a run page's "compare with…".

Models are listed from every export location: `{artifact_root}/models` and each distinct
resolved `export_uri` the runs recorded in their config.json (tasks.runs.run_summary). A link
names a location only by its `location_id` (a hash the server computes), which the card route
looks up in that server-side set; a location path never comes from the request.

Server-rendered HTML, no JavaScript (the index's Compare button is a plain GET form). It
reads the artifact store through `tasks.io.storage`
(`tasks.runs.run_summary`), so local, gs:// and s3:// roots work, and never talks to training
processes. A name taken from a request path must match a strict pattern and be listed under
the artifact root (or the known export location) before it becomes part of a URI: anything
else is 400 or 404.
"""
from __future__ import annotations

import html
import json
import math
from urllib.parse import quote

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, PlainTextResponse

from bertflow_airflow.timetables import BackfillOnlyTimetable  # noqa: E402
from tasks.runs import compare, goodput, lineage, run_summary  # noqa: E402
from tasks.io import storage
from tasks.config import default_artifact_root  # noqa: E402
from tasks.io.uris import join_uri  # noqa: E402
from tasks.errors import StorageError  # noqa: E402

# The api-server mounts plugin apps without the core API's auth dependencies, so the page
# declares them itself: a logged-in user (the JWT the UI holds as a cookie, or a bearer token)
# allowed to read bert_finetune's runs. Anonymous requests get 401, others without that
# permission 403.
app = FastAPI(title="bertflow artifacts", dependencies=[
    Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id="bert_finetune"))])

esc = html.escape

_STYLE = """<style>
body{font-family:system-ui,sans-serif;margin:16px;color:#222}
table{border-collapse:collapse;margin:6px 0 18px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:13px;white-space:nowrap}
th{background:#f3f3f3} td.l,th.l{text-align:left}
tr.group th{background:#e4ecf7;text-align:left}
.champion{color:#b8860b;font-weight:bold} code{background:#f6f6f6;padding:1px 3px}
.charts svg{margin:0 12px 12px 0;border:1px solid #ddd;background:#fff}
a.sort{color:inherit}
</style>"""


def _checked(*names: str) -> None:
    """400 unless every name is one path segment of the shape run folders and versions use."""
    if not all(run_summary.valid_name(n) for n in names):
        raise HTTPException(400, "bad name")


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-2 or abs(value) >= 1e4 \
            else f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return esc(str(value))


def _duration(seconds) -> str:
    if seconds is None:
        return "–"
    seconds = float(seconds)
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _link(*parts: str) -> str:
    return "/".join(quote(p, safe="") for p in parts)


def _card_href(prefix: str, model: str, version: str, location_id: str | None,
               default: bool) -> str:
    """The model card route of a version; `?location=` names a non-default export location
    by its id."""
    href = f"{prefix}models/{_link(str(model), str(version))}/card"
    return href if default else f"{href}?location={quote(location_id or '', safe='')}"


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"{_STYLE}</head><body>{body}</body></html>")


# --- the index page ------------------------------------------------------------------------

# (key, heading, value of a run summary row)
COLUMNS = [
    ("date", "date (logical date or run id)", lambda r: r["date"]),
    ("learning_rate", "learning rate", lambda r: r["learning_rate"]),
    ("epochs", "epochs", lambda r: r["epochs"]),
    ("batch", "batch (global / per replica)",
     lambda r: r["global_batch_size"] or r["per_replica_batch_size"]),
    ("max_seq_length", "max_seq_length", lambda r: r["max_seq_length"]),
    ("strategy", "strategy", lambda r: r["strategy"]),
    ("provisioner", "provisioner", lambda r: r["provisioner"]),
    ("accuracy", "accuracy", lambda r: r["accuracy"]),
    ("macro_f1", "macro-F1", lambda r: r["macro_f1"]),
    ("train_seconds", "train time", lambda r: r["train_seconds"]),
    ("examples_per_second", "examples/s", lambda r: r["examples_per_second"]),
    ("version", "model version", lambda r: r["version"]),
]
SORT_KEYS = {key: get for key, _, get in COLUMNS}


def _sorted(rows: list[dict], key: str, descending: bool) -> list[dict]:
    get = SORT_KEYS[key]
    present = [r for r in rows if get(r) is not None]
    missing = [r for r in rows if get(r) is None]  # always last
    try:
        present.sort(key=get, reverse=descending)
    except TypeError:  # mixed types in one column
        present.sort(key=lambda r: str(get(r)), reverse=descending)
    return present + missing


def _models_html(models: list[dict]) -> str:
    if not models:
        return "<p>No complete model versions yet.</p>"
    out = []
    for m in models:
        champ = m["champion"]
        note = (f"champion: <span class='champion'>&#9733; {esc(str(champ.get('version')))}"
                f"</span> ({esc(str(champ.get('metric')))} {_fmt(champ.get('value'))}, "
                f"promoted {esc(str(champ.get('promoted_at', '')))})" if champ
                else "no champion yet")
        rows = "".join(
            f"<tr class='{'champion' if v['champion'] else ''}'>"
            f"<td class='l'>{'&#9733; ' if v['champion'] else ''}{esc(v['version'])}</td>"
            f"<td>{_fmt(v['accuracy'])}</td><td>{_fmt(v['macro_f1'])}</td>"
            f"<td class='l'><a href='"
            f"{_card_href('', m['model'], v['version'], m['location_id'], m['default_location'])}"
            f"'>model card</a> <a class='lineage' href='models/"
            f"{_link(m['model'], v['version'])}{_location_query(m)}'>lineage</a></td>"
            f"<td class='l'><code>{esc(v['uri'])}</code></td></tr>"
            for v in m["versions"])
        where = "" if m["default_location"] else \
            f" <small>in <code>{esc(m['location'])}</code></small>"
        out.append(f"<h4>{esc(m['model'])}{where}</h4><p>{note}</p><table class='models' "
                   f"data-model='{esc(m['model'])}' data-location='{esc(m['location_id'])}'>"
                   f"<tr><th class='l'>version</th>"
                   f"<th>accuracy</th><th>macro-F1</th><th class='l'>card</th>"
                   f"<th class='l'>location</th></tr>{rows}</table>")
    return "".join(out)


def _experiments_html(groups: dict[str, list[dict]], champions: set, default_location: str,
                      sort: str, descending: bool) -> str:
    if not groups:
        return "<p>No runs yet.</p>"
    head = "".join(
        f"<th class='{'l' if key in ('date', 'strategy', 'provisioner', 'version') else ''}'>"
        f"<a class='sort' href='?sort={key}&amp;order="
        f"{'asc' if key == sort and descending else 'desc'}'>{esc(title)}"
        f"{(' &#9660;' if descending else ' &#9650;') if key == sort else ''}</a></th>"
        for key, title, _ in COLUMNS)
    body = []
    for experiment, rows in groups.items():
        body.append(f"<tr class='group' data-experiment='{esc(experiment)}'>"
                    f"<th colspan='{len(COLUMNS)}'>experiment {esc(experiment)} "
                    f"({len(rows)} run{'s' if len(rows) != 1 else ''})</th></tr>")
        for r in _sorted(rows, sort, descending):
            champion = (r["export_location"], r["model_name"], r["version"]) in champions
            version = "–"
            if r["version"]:
                version = f"{'&#9733; ' if champion else ''}{esc(str(r['version']))}"
                if run_summary.valid_name(str(r["model_name"])) and \
                        run_summary.valid_name(str(r["version"])) and r["export_location"]:
                    href = _card_href("", r["model_name"], r["version"],
                                      r["export_location_id"],
                                      r["export_location"] == default_location)
                    version = (f"{'&#9733; ' if champion else ''}<a href='{href}'>"
                               f"{esc(r['version'])}</a>")
            body.append(
                f"<tr class='run' data-experiment='{esc(experiment)}' "
                f"data-run='{esc(r['run_key'])}'>"
                f"<td class='l'><input type='checkbox' form='compare' name='run' "
                f"value='{esc(r['dag_id'])}/{esc(r['run_key'])}'> "
                f"<a href='runs/{_link(r['dag_id'], r['run_key'])}'>"
                f"{esc(str(r['date']))}</a></td>"
                f"<td>{_fmt(r['learning_rate'])}</td><td>{_fmt(r['epochs'])}</td>"
                f"<td>{_fmt(r['global_batch_size'])} / {_fmt(r['per_replica_batch_size'])}</td>"
                f"<td>{_fmt(r['max_seq_length'])}</td><td class='l'>{_fmt(r['strategy'])}</td>"
                f"<td class='l'>{_fmt(r['provisioner'])}</td>"
                f"<td class='accuracy'>{_fmt(r['accuracy'])}</td>"
                f"<td class='macro_f1'>{_fmt(r['macro_f1'])}</td>"
                f"<td>{_duration(r['train_seconds'])}</td>"
                f"<td>{_fmt(r['examples_per_second'])}</td>"
                f"<td class='l{' champion' if champion else ''}'>{version}</td></tr>")
    return (f"<table class='experiments'><tr>{head}</tr>{''.join(body)}</table>"
            f"{_COMPARE_FORM}")


# The experiments table's checkboxes belong to this form (form='compare'): GET compare?run=...
_COMPARE_FORM = ("<form id='compare' action='compare' method='get'><button type='submit'>"
                 "Compare selected runs</button> <small>(tick two or more)</small></form>")


@app.get("/", response_class=HTMLResponse)
def index(sort: str = "date", order: str = "desc") -> str:
    if sort not in SORT_KEYS or order not in ("asc", "desc"):
        raise HTTPException(400, f"sort must be one of {sorted(SORT_KEYS)}, order asc|desc")
    root = default_artifact_root()
    groups = run_summary.experiments(root)
    locations = run_summary.export_locations(
        root, [r for rows in groups.values() for r in rows])
    models = run_summary.models(root, locations)
    champions = {(m["location"], m["model"], m["champion"].get("version"))
                 for m in models if m["champion"]}
    return _page("bertflow", (
        f"<h2>bertflow artifacts in <code>{esc(root)}</code></h2>"
        f"<h3>Models</h3>{_models_html(models)}"
        f"<h3>Experiments</h3>"
        f"{_experiments_html(groups, champions, locations[0], sort, order == 'desc')}"))


# --- the run page ------------------------------------------------------------------------

def line_chart(points: list[tuple[float, float]], title: str, series: str, color: str,
               width: int = 420, height: int = 240) -> str:
    """A hand-written SVG line chart: axes, 5 ticks on each, one polyline."""
    return overlay_chart([(None, color, points)], title, series, width, height)


def overlay_chart(lines: list[tuple[str | None, str, list[tuple[float, float]]]], title: str,
                  series: str, width: int = 420, height: int = 240) -> str:
    """line_chart with one polyline per (run, colour, points) on shared axes; a named run's
    polyline carries `data-run`."""
    left, right, top, bottom = 64, 16, 28, 40
    lines = [line for line in lines if line[2]]
    if not lines:
        return ""
    xs = [p[0] for _, _, points in lines for p in points]
    ys = [p[1] for _, _, points in lines for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - left - right, height - top - bottom

    def sx(x):
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    ticks = []
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        xv = x0 + (x1 - x0) * i / 4
        ticks.append(f"<line x1='{left - 4}' y1='{sy(yv):.1f}' x2='{left + pw}' "
                     f"y2='{sy(yv):.1f}' stroke='#eee'/>"
                     f"<text x='{left - 6}' y='{sy(yv) + 4:.1f}' text-anchor='end' "
                     f"font-size='10'>{_fmt(yv, 3)}</text>"
                     f"<text x='{sx(xv):.1f}' y='{top + ph + 14}' text-anchor='middle' "
                     f"font-size='10'>{xv:.0f}</text>")
    drawn = []
    for run, color, points in lines:
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        lx, ly = points[-1]
        named = f" data-run='{esc(run)}'" if run is not None else ""
        drawn.append(
            f"<polyline class='{esc(series)}' points='{line}'{named} fill='none' "
            f"stroke='{color}' stroke-width='2'/>"
            f"<circle cx='{sx(lx):.1f}' cy='{sy(ly):.1f}' r='3' fill='{color}'>"
            f"<title>{esc(run) + ', ' if run is not None else ''}step {lx:.0f}: "
            f"{_fmt(ly)}</title></circle>")
    return (f"<svg class='chart' data-series='{esc(series)}' width='{width}' "
            f"height='{height}' viewBox='0 0 {width} {height}' "
            f"xmlns='http://www.w3.org/2000/svg' role='img' aria-label='{esc(title)}'>"
            f"<text x='{width / 2}' y='16' text-anchor='middle' font-size='13' "
            f"font-weight='bold'>{esc(title)}</text>{''.join(ticks)}"
            f"<line class='axis' x1='{left}' y1='{top}' x2='{left}' y2='{top + ph}' "
            f"stroke='#333'/>"
            f"<line class='axis' x1='{left}' y1='{top + ph}' x2='{left + pw}' "
            f"y2='{top + ph}' stroke='#333'/>"
            f"<text x='{left + pw / 2}' y='{height - 6}' text-anchor='middle' "
            f"font-size='11'>step</text>{''.join(drawn)}</svg>")


def confusion_svg(matrix: list[list[int]], labels: list[str]) -> str:
    """A heat-map grid (rows: true label, columns: predicted), shaded by the share of each
    true label's examples, with the counts in the cells and the labels on both axes."""
    n = len(labels)
    if not n or len(matrix) != n or any(
            not isinstance(row, list) or len(row) != n or
            not all(isinstance(c, int) and c >= 0 for c in row) for row in matrix):
        return ""  # not a matrix the evaluate step writes: draw nothing rather than fail
    cell = max(22, min(64, 520 // n))
    shown = [lb if len(lb) <= 18 else lb[:17] + "…" for lb in labels]
    left = min(170, 16 + 7 * max(len(s) for s in shown)) + 24
    top = min(150, 16 + 6 * max(len(s) for s in shown)) + 24
    width, height = left + cell * n + 16, top + cell * n + 16
    parts = [f"<text x='{left + cell * n / 2}' y='14' text-anchor='middle' font-size='12' "
             f"font-weight='bold'>predicted</text>",
             f"<text x='12' y='{top + cell * n / 2}' text-anchor='middle' font-size='12' "
             f"font-weight='bold' transform='rotate(-90 12 {top + cell * n / 2})'>"
             f"true label</text>"]
    for i, (label, short) in enumerate(zip(labels, shown)):
        cy = top + cell * i + cell / 2
        cx = left + cell * i + cell / 2
        parts.append(f"<text class='row-label' x='{left - 6}' y='{cy + 4:.1f}' "
                     f"text-anchor='end' font-size='11'><title>{esc(label)}</title>"
                     f"{esc(short)}</text>")
        parts.append(f"<text class='col-label' x='{cx:.1f}' y='{top - 6}' font-size='11' "
                     f"transform='rotate(-45 {cx:.1f} {top - 6})'><title>{esc(label)}</title>"
                     f"{esc(short)}</text>")
    for i, row in enumerate(matrix):
        total = sum(row) or 1
        for j, count in enumerate(row):
            share = count / total
            shade = tuple(round(255 - share * (255 - c)) for c in (31, 95, 168))
            x, y = left + cell * j, top + cell * i
            parts.append(
                f"<rect class='cell' x='{x}' y='{y}' width='{cell}' height='{cell}' "
                f"fill='rgb{shade}' stroke='#fff'><title>true {esc(labels[i])}, predicted "
                f"{esc(labels[j])}: {count} ({share:.0%})</title></rect>"
                f"<text x='{x + cell / 2}' y='{y + cell / 2 + 4}' text-anchor='middle' "
                f"font-size='11' fill='{'#fff' if share > 0.55 else '#222'}'>{count}</text>")
    return (f"<svg class='confusion' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' xmlns='http://www.w3.org/2000/svg' role='img' "
            f"aria-label='confusion matrix'>{''.join(parts)}</svg>")


def _charts_html(history: list[dict]) -> str:
    if not history:
        return "<p>No training history yet (<code>train/history.json</code>).</p>"
    charts = []
    for key, title, color in (("loss", "training loss", "#c0392b"),
                              ("accuracy", "training accuracy", "#1f5fa8"),
                              ("learning_rate", "learning rate", "#2e8b57")):
        points = [(float(r["step"]), float(r[key])) for r in history
                  if isinstance(r, dict) and isinstance(r.get("step"), int)
                  and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        charts.append(line_chart(points, title, key, color))
    return f"<div class='charts'>{''.join(charts)}</div>"


def _metrics_html(metrics: dict | None) -> str:
    if not metrics:
        return "<p>Not evaluated yet (<code>evaluate/metrics.json</code>).</p>"
    labels = [str(x) for x in metrics.get("labels") or []]
    per_class = metrics.get("per_class") or {}
    rows = "".join(
        f"<tr><td class='l'>{esc(label)}</td><td>{_fmt(m.get('precision'))}</td>"
        f"<td>{_fmt(m.get('recall'))}</td><td>{_fmt(m.get('f1'))}</td>"
        f"<td>{_fmt(m.get('support'))}</td></tr>"
        for label, m in per_class.items() if isinstance(m, dict))
    return (f"<p>accuracy <b>{_fmt(metrics.get('accuracy'))}</b>, macro-F1 "
            f"<b>{_fmt(metrics.get('macro_f1'))}</b> on {_fmt(metrics.get('num_examples'))} "
            f"examples</p>{confusion_svg(metrics.get('confusion_matrix') or [], labels)}"
            f"<table><tr><th class='l'>label</th><th>precision</th><th>recall</th>"
            f"<th>f1</th><th>support</th></tr>{rows}</table>")


@app.get("/runs/{dag_id}/{run_key}", response_class=HTMLResponse)
def run_page(dag_id: str, run_key: str) -> str:
    _checked(dag_id, run_key)
    root = default_artifact_root()
    if (dag_id, run_key) not in run_summary.list_runs(root):
        raise HTTPException(404, "no such run folder")
    run = run_summary.run_detail(root, dag_id, run_key)
    train = run["train"]
    tb_dir = train.get("tensorboard_dir") or join_uri(run["uri"], "train", "tensorboard")
    config = [("experiment", run["experiment"]), ("logical date", run["logical_date"] or "–"),
              ("run id", run["run_id"] or "–"), ("learning rate", run["learning_rate"]),
              ("epochs", run["epochs"]), ("per-replica batch", run["per_replica_batch_size"]),
              ("global batch", run["global_batch_size"]),
              ("max_seq_length", run["max_seq_length"]), ("strategy", run["strategy"]),
              ("provisioner", run["provisioner"]), ("steps", run["steps"]),
              ("train time", _duration(run["train_seconds"])),
              ("examples/s", run["examples_per_second"]),
              ("goodput", goodput.describe(run["goodput_detail"])),
              ("steps done", ", ".join(run["steps_done"]) or "–")]
    config_rows = "".join(f"<tr><th class='l'>{esc(k)}</th><td class='l'>"
                          f"{v if k == 'train time' else _fmt(v)}</td></tr>" for k, v in config)
    model = "<p>Not exported yet.</p>"
    if run["version"]:
        reason = run["promote_reason"]
        name = f"{esc(str(run['model_name']))} {esc(str(run['version']))}"
        if run_summary.valid_name(str(run["model_name"])) and \
                run_summary.valid_name(str(run["version"])) and run["export_location"]:
            href = _card_href("../../", run["model_name"], run["version"],
                              run["export_location_id"],
                              run["export_location"] == run_summary.default_location(root))
            name = f"<a href='{href}'>{name}</a>"
        where = "" if run["export_location"] == run_summary.default_location(root) else \
            f" in <code>{esc(str(run['export_location']))}</code>"
        model = (f"<p>Exported as {name}{where}{'; promoted' if run['promoted'] else ''}"
                 f"{(' (' + esc(str(reason)) + ')') if reason else ''}</p>")
    return _page(f"bertflow run {dag_id} / {run_key}", (
        f"<p><a href='../../'>&larr; all runs and models</a></p>"
        f"<h2>Run {esc(dag_id)} / {esc(run_key)}</h2><p><code>{esc(run['uri'])}</code></p>"
        f"<table class='config'>{config_rows}</table>"
        f"{_compare_links(root, dag_id, run_key, run['experiment'])}"
        f"{_sweep_html(dag_id, run['sweep'])}"
        f"<h3>Training</h3>{_charts_html(run['history'])}"
        f"<p>TensorBoard logs: <code>{esc(tb_dir)}</code><br>view them with "
        f"<code class='tensorboard'>tensorboard --logdir {esc(tb_dir)}</code></p>"
        f"<h3>Evaluation</h3>{_metrics_html(run['metrics'])}"
        f"<h3>Model</h3>{model}"
        f"<h3>Worker logs</h3>{_logs_html(run_key, run['logs'])}"))


def _sweep_html(dag_id: str, trials: list[dict] | None) -> str:
    """A sweep's trials with their metrics, the chosen one starred, and all of them side by
    side on the compare page."""
    if trials is None:
        return ""
    rows = "".join(
        f"<tr class='trial'><td class='l'>{'&#9733; ' if t['best'] else ''}"
        f"<a href='{quote(t['run_key'], safe='')}'>{esc(t['label'])}</a></td>"
        f"<td class='accuracy'>{_fmt(t['accuracy'])}</td>"
        f"<td class='macro_f1'>{_fmt(t['macro_f1'])}</td></tr>" for t in trials)
    compare = ""
    if len(trials) > 1:
        refs = [f"{dag_id}/{t['run_key']}" for t in trials]
        compare = (f"<p><a class='compare' href='{_compare_href('../../', refs)}'>compare "
                   f"all {len(trials)} trials</a></p>")
    return (f"<h3>Sweep</h3><table class='sweep'><tr><th class='l'>trial</th>"
            f"<th>accuracy</th><th>macro F1</th></tr>{rows}</table>{compare}")


def _logs_html(run_key: str, logs: list[tuple[str, str]]) -> str:
    if not logs:
        return "<p>No worker logs kept yet.</p>"
    items = "".join(f"<li><a class='log' href='{quote(run_key)}/logs/{quote(step)}/"
                    f"{quote(name)}'>{esc(step)} / {esc(name)}</a></li>" for step, name in logs)
    return f"<ul class='logs'>{items}</ul>"


@app.get("/runs/{dag_id}/{run_key}/logs/{step}/{name}", response_class=PlainTextResponse)
def worker_log(dag_id: str, run_key: str, step: str, name: str) -> str:
    """A worker's log; only one the run folder lists (run_summary.worker_logs)."""
    _checked(dag_id, run_key)
    if step not in run_summary.LOG_STEPS or not run_summary.LOG_NAME.fullmatch(name):
        raise HTTPException(400, "bad log name")
    root = default_artifact_root()
    if (dag_id, run_key) not in run_summary.list_runs(root):
        raise HTTPException(404, "no such run folder")
    uri = run_summary.worker_log_uri(root, dag_id, run_key, step, name)
    if uri is None:
        raise HTTPException(404, "no such worker log")
    try:
        return storage.read_text(uri)
    except StorageError as err:
        raise HTTPException(404, str(err)) from None


@app.get("/models/{model}/{version}/card", response_class=PlainTextResponse)
def model_card(model: str, version: str, location: str | None = None) -> str:
    """A version's model card. `location` is a location_id from the index page's links,
    looked up among the export locations the server knows (never a path); without it,
    {artifact_root}/models."""
    _checked(model, version)
    where = _location(default_artifact_root(), location)
    if (model, version) not in run_summary.list_versions_at(where):
        raise HTTPException(404, "no such complete model version")
    try:
        return storage.read_text(join_uri(where, model, version, "model_card.md"))
    except StorageError as err:
        raise HTTPException(404, str(err)) from None


# --- lineage --------------------------------------------------------------------------------

def _location_query(m: dict) -> str:
    return "" if m["default_location"] else f"?location={quote(m['location_id'], safe='')}"


def _location(root: str, location: str | None) -> str:
    """The export location a request names by its id (never a path); default {root}/models."""
    if location is None:
        return run_summary.default_location(root)
    if not run_summary.LOCATION_ID.fullmatch(location):
        raise HTTPException(400, "bad location")
    where = run_summary.locations_by_id(root).get(location)
    if where is None:
        raise HTTPException(404, "no such export location")
    return where


def _data_link(prefix: str, key) -> str:
    return (f"<a class='data' href='{prefix}data?q={quote(str(key), safe='')}'>"
            f"<code>{esc(str(key))}</code></a>")


@app.get("/models/{model}/{version}", response_class=HTMLResponse)
def version_page(model: str, version: str, location: str | None = None) -> str:
    """Which data, config, checkpoint and code produced this version."""
    _checked(model, version)
    root = default_artifact_root()
    where = _location(root, location)
    if (model, version) not in run_summary.list_versions_at(where):
        raise HTTPException(404, "no such complete model version")
    record = lineage.read(join_uri(where, model, version))
    prefix = "../../"
    if record is None:
        body = "<p>No lineage recorded for this version (<code>lineage.json</code>).</p>"
    else:
        data = "".join(
            f"<tr><th class='l'>{esc(str(split))}</th><td class='l'>"
            f"{_data_link(prefix, src.get('uri'))}</td><td class='l'>"
            f"{_data_link(prefix, src.get('sha256'))}</td></tr>"
            for split, src in (record.get("data") or {}).items() if isinstance(src, dict))
        base, code = record.get("base_model") or {}, record.get("code") or {}
        metrics = record.get("metrics") or {}
        revision = f" @ {esc(str(base['revision']))}" if base.get("revision") else ""
        base_hash = esc(str(base.get("sha256") or base.get("hash")))
        facts = [("token cache key", _data_link(prefix, record.get("tfrecord_cache_key"))),
                 ("base checkpoint", f"<code>{esc(str(base.get('source')))}</code>{revision}"
                                     f" sha256 <code>{base_hash}</code>"),
                 ("code", f"bertflow {esc(str(code.get('bertflow')))}, git commit "
                          f"<code>{esc(str(code.get('git_commit')))}</code>"),
                 ("DAG run", f"{esc(str(record.get('dag_id')))} / "
                             f"<code class='run-id'>{esc(str(record.get('run_id')))}</code>"),
                 ("experiment", esc(str(record.get("experiment")))),
                 ("metrics", f"accuracy {_fmt(metrics.get('accuracy'))}, macro-F1 "
                             f"{_fmt(metrics.get('macro_f1'))}")]
        run_key = str(record.get("run_key") or "")
        if run_summary.valid_name(str(record.get("dag_id"))) and run_summary.valid_name(run_key):
            facts.append(("run page", f"<a href='{prefix}runs/"
                                      f"{_link(str(record['dag_id']), run_key)}'>run page</a>"))
        fact_rows = [f"<tr><th class='l'>{esc(k)}</th><td class='l'>{v}</td></tr>"
                     for k, v in facts]
        config = "".join(f"<tr><th class='l'>{esc(str(k))}</th><td class='l'>{_fmt(v)}</td></tr>"
                         for k, v in sorted((record.get("config") or {}).items()))
        body = (f"<h3>Data</h3><table class='data'><tr><th class='l'>split</th>"
                f"<th class='l'>URI</th><th class='l'>sha256</th></tr>{data}</table>"
                f"<table class='facts'>{''.join(fact_rows)}</table>"
                f"<h3>Config</h3><table class='config'>{config}</table>")
    return _page(f"bertflow {model} {version}", (
        f"<p><a href='{prefix}'>&larr; all runs and models</a></p>"
        f"<h2>{esc(model)} {esc(version)}</h2><p><code>{esc(join_uri(where, model, version))}"
        f"</code></p>{body}"))


@app.get("/data", response_class=HTMLResponse)
def data_page(q: str = "") -> str:
    """The versions at every known export location whose data the query names."""
    root = default_artifact_root()
    found = []
    if q.strip():
        for m in run_summary.models(root):
            for v in m["versions"]:
                record = lineage.read(v["uri"])
                if record and lineage.matches(record, q):
                    found.append((m, v, record))
    def hashes(record: dict) -> str:
        return ", ".join(esc(str(src.get("sha256", ""))[:12])
                         for src in (record.get("data") or {}).values() if isinstance(src, dict))

    rows = "".join(
        f"<tr class='version'><td class='l'><a href='models/{_link(m['model'], v['version'])}"
        f"{_location_query(m)}'>{esc(m['model'])} {esc(v['version'])}</a></td>"
        f"<td class='l'><code>{esc(str(r.get('run_id')))}</code></td>"
        f"<td>{_fmt(v['accuracy'])}</td><td class='l'>{hashes(r)}</td></tr>"
        for m, v, r in found)
    table = (f"<table class='versions'><tr><th class='l'>version</th><th class='l'>DAG run"
             f"</th><th>accuracy</th><th class='l'>data sha256</th></tr>{rows}</table>"
             if found else "<p>No version came from data matching that.</p>" if q.strip()
             else "")
    return _page("bertflow data", (
        "<p><a href='./'>&larr; all runs and models</a></p><h2>Which versions came from this "
        "data</h2><form method='get'><input name='q' size='80' placeholder='sha256, data URI "
        f"or token cache key' value='{esc(q)}'> <button>search</button></form>{table}"))


# --- the compare page ------------------------------------------------------------------------

# Tableau 10: distinct hues for the runs' curves and legend (cycled beyond 10 runs).
RUN_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
              "#7f7f7f", "#bcbd22", "#17becf"]


def _value(value) -> str:
    """A config or metric value in a cell, exact (floats as their shortest round-trip repr:
    two values that differ never read the same), containers as JSON."""
    if value is compare.ABSENT:
        return "<i class='absent'>absent</i>"
    if isinstance(value, (dict, list, float)):
        return esc(json.dumps(value))
    return _fmt(value)


def _fields_html(kind: str, differing: list, equal: list, runs: list[dict]) -> str:
    """The fields that differ (one column per run) and, folded, the ones all runs share."""
    heads = "".join(f"<th class='l'>{_swatch(i)}{esc(r['ref'])}</th>" for i, r in
                    enumerate(runs))
    rows = "".join(f"<tr class='differs' data-field='{esc(name)}'><th class='l'>{esc(name)}"
                   f"</th>{''.join(f'<td>{_value(v)}</td>' for v in values)}</tr>"
                   for name, values in differing)
    table = (f"<table class='differs {esc(kind)}'><tr><th class='l'>{esc(kind)}</th>{heads}"
             f"</tr>{rows}</table>" if differing else
             f"<p class='none-differ'>No {esc(kind)} field differs.</p>")
    same = "".join(f"<tr class='equal' data-field='{esc(name)}'><th class='l'>{esc(name)}</th>"
                   f"<td class='l'>{_value(v)}</td></tr>" for name, v in equal)
    folded = (f"<details class='equal {esc(kind)}'><summary>all {len(equal)} other "
              f"{esc(kind)} field{'s' if len(equal) != 1 else ''} equal</summary>"
              f"<table>{same}</table></details>" if equal else "")
    return table + folded


def _swatch(i: int) -> str:
    return (f"<span class='swatch' style='display:inline-block;width:10px;height:10px;"
            f"margin-right:4px;background:{RUN_COLORS[i % len(RUN_COLORS)]}'></span>")


def _confusion_table(run: dict) -> str:
    """A run's confusion matrix as a table (rows: true label, columns: predicted), from its
    evaluate/metrics.json; its own labels, so runs of different label sets compare."""
    metrics = run["evaluation"] or {}
    labels = [str(x) for x in metrics.get("labels") or []]
    matrix = metrics.get("confusion_matrix")
    if not labels or not isinstance(matrix, list) or len(matrix) != len(labels) or any(
            not isinstance(row, list) or len(row) != len(labels) for row in matrix):
        return (f"<p class='no-matrix' data-run='{esc(run['ref'])}'>{esc(run['ref'])}: no "
                f"confusion matrix (<code>evaluate/metrics.json</code>).</p>")
    head = "".join(f"<th>{esc(lb)}</th>" for lb in labels)
    rows = "".join(f"<tr><th class='l'>{esc(lb)}</th>"
                   f"{''.join(f'<td>{_fmt(c)}</td>' for c in row)}</tr>"
                   for lb, row in zip(labels, matrix))
    return (f"<table class='confusion-table' data-run='{esc(run['ref'])}'>"
            f"<caption style='text-align:left;white-space:nowrap;font-weight:bold'>"
            f"{esc(run['ref'])}</caption>"
            f"<tr><th class='l'>true \\ predicted</th>{head}</tr>{rows}</table>")


@app.get("/compare", response_class=HTMLResponse)
def compare_page(run: list[str] = Query(default=[])) -> str:
    """Runs side by side: `?run=dag_id/run_key&run=...` (two or more run folders)."""
    root = default_artifact_root()
    try:
        shown = compare.compare(root, compare.parse_refs(run))
    except compare.CompareError as err:
        raise HTTPException(err.status, str(err)) from None
    runs = shown["runs"]
    legend = "".join(
        f"<tr data-run='{esc(r['ref'])}'><td class='l'>{_swatch(i)}"
        f"<a href='runs/{_link(*r['ref'].split('/'))}'>{esc(r['ref'])}</a></td>"
        f"<td class='l'>{esc(str(r['summary']['experiment']))}</td>"
        f"<td class='l'>{esc(str(r['summary']['date']))}</td></tr>"
        for i, r in enumerate(runs))
    legend_line = " ".join(f"<span data-run='{esc(r['ref'])}'>{_swatch(i)}{esc(r['ref'])}"
                           f"</span>" for i, r in enumerate(runs))
    charts = "".join(
        overlay_chart([(r["ref"], RUN_COLORS[i % len(RUN_COLORS)], r["curves"].get(key, []))
                       for i, r in enumerate(runs)], key.replace("_", " "), key)
        for key in shown["series"])
    training = (f"<p class='legend'>{legend_line}</p><div class='charts'>{charts}</div>"
                if charts else "<p>No training history (<code>train/history.json</code>).</p>")
    return _page("bertflow compare", (
        f"<p><a href='./'>&larr; all runs and models</a></p>"
        f"<h2>Comparing {len(runs)} runs</h2>"
        f"<table class='runs'><tr><th class='l'>run</th><th class='l'>experiment</th>"
        f"<th class='l'>date</th></tr>{legend}</table>"
        f"<h3>Config</h3>"
        f"{_fields_html('config', shown['config_differing'], shown['config_equal'], runs)}"
        f"<h3>Metrics</h3>"
        f"{_fields_html('metrics', shown['metrics_differing'], shown['metrics_equal'], runs)}"
        f"<h3>Training</h3>"
        f"{training}"
        f"<h3>Confusion matrices</h3>{''.join(_confusion_table(r) for r in runs)}"))


def _compare_href(prefix: str, refs: list[str]) -> str:
    return f"{prefix}compare?" + "&amp;".join(f"run={quote(ref, safe='')}" for ref in refs)


def _compare_links(root: str, dag_id: str, run_key: str, experiment: str) -> str:
    """The run page's "compare with…": each other run of its experiment, all of them, and
    the index, where any runs can be picked."""
    this = f"{dag_id}/{run_key}"
    others = [(f"{r['dag_id']}/{r['run_key']}", r["date"])
              for r in run_summary.experiments(root).get(experiment, [])
              if (r["dag_id"], r["run_key"]) != (dag_id, run_key)]
    links = [f"<a class='compare' href='{_compare_href('../../', [this, ref])}'>"
             f"{esc(str(date))}</a>" for ref, date in others]
    if len(others) > 1:
        refs = [this] + [ref for ref, _ in others]
        links.append(f"<a class='compare' href='{_compare_href('../../', refs)}'>all "
                     f"{len(refs)} runs of experiment {esc(experiment)}</a>")
    links.append("<a href='../../#compare'>pick runs on the index</a>")
    return f"<p class='compare-with'>compare with&hellip; {', '.join(links)}</p>"


class BertflowPlugin(AirflowPlugin):
    name = "bertflow"
    fastapi_apps = [{"app": app, "url_prefix": "/bertflow", "name": "bertflow artifacts"}]
    # bert_finetune's default schedule: the scheduler and api-server deserialize it by name.
    timetables = [BackfillOnlyTimetable]
    external_views = [{"name": "bertflow models", "href": "/bertflow/", "destination": "nav",
                       "url_route": "bertflow"}]
