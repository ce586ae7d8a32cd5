"""The bertflow page's FastAPI app: one handler per page, each checking the names a request
gives, reading the artifact store through tasks.runs and rendering a template
(bertflow_ui/templates/). The pages are described in plugins/bertflow_plugin.py.

A name taken from a request path must match a strict pattern and be listed under the
artifact root (or the known export location) before it becomes part of a URI: anything else
is 400 or 404. An export location is named only by its `location_id`.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, PlainTextResponse

from bertflow_ui import charts
from bertflow_ui.formatting import duration, exact, fmt
from bertflow_ui.templating import render
from tasks.config import default_artifact_root
from tasks.errors import StorageError
from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.runs import compare, goodput, lineage, run_summary

# The api-server mounts plugin apps without the core API's auth dependencies, so the page
# declares them itself: a logged-in user (the JWT the UI holds as a cookie, or a bearer token)
# allowed to read bert_finetune's runs. Anonymous requests get 401, others without that
# permission 403.
app = FastAPI(title="bertflow artifacts", dependencies=[
    Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id="bert_finetune"))])


def _checked(*names: str) -> None:
    """400 unless every name is one path segment of the shape run folders and versions use."""
    if not all(run_summary.valid_name(n) for n in names):
        raise HTTPException(400, "bad name")


def _link(*parts: str) -> str:
    return "/".join(quote(str(p), safe="") for p in parts)


def _card_href(prefix: str, model: str, version: str, location_id: str | None,
               default: bool) -> str:
    """The model card route of a version; `?location=` names a non-default export location
    by its id."""
    href = f"{prefix}models/{_link(model, version)}/card"
    return href if default else f"{href}?location={quote(location_id or '', safe='')}"


def _run_card_href(prefix: str, run: dict, default_location: str) -> str | None:
    """The card link of the version a run (or a sweep's best trial) exported, when its names
    are safe to put in a link and its location is known."""
    if not (run["version"] and run["export_location"]
            and run_summary.valid_name(str(run["model_name"]))
            and run_summary.valid_name(str(run["version"]))):
        return None
    return _card_href(prefix, str(run["model_name"]), str(run["version"]),
                      run["export_location_id"], run["export_location"] == default_location)


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


def _compare_href(prefix: str, refs: list[str]) -> str:
    """The compare page for `dag_id/run_key` refs (the template escapes the `&`s)."""
    return f"{prefix}compare?" + "&".join(f"run={quote(ref, safe='')}" for ref in refs)


# --- the index page ------------------------------------------------------------------------

# (key, heading, value of a run summary row, left-aligned)
COLUMNS = [
    ("date", "run (logical date, run id or trial)", lambda r: r["date"], True),
    ("learning_rate", "learning rate", lambda r: r["learning_rate"], False),
    ("epochs", "epochs", lambda r: r["epochs"], False),
    ("batch", "batch (global / per replica)",
     lambda r: r["global_batch_size"] or r["per_replica_batch_size"], False),
    ("max_seq_length", "max seq length", lambda r: r["max_seq_length"], False),
    ("strategy", "strategy", lambda r: r["strategy"], True),
    ("provisioner", "provisioner", lambda r: r["provisioner"], True),
    ("accuracy", "accuracy", lambda r: r["accuracy"], False),
    ("macro_f1", "macro-F1", lambda r: r["macro_f1"], False),
    ("train_seconds", "train time", lambda r: r["train_seconds"], False),
    ("examples_per_second", "examples/s", lambda r: r["examples_per_second"], False),
    ("version", "model version", lambda r: r["version"], True),
]
SORT_KEYS = {key: get for key, _, get, _ in COLUMNS}


def _sorted(rows: list[dict], key: str, descending: bool) -> list[dict]:
    get = SORT_KEYS[key]
    present = [r for r in rows if get(r) is not None]
    missing = [r for r in rows if get(r) is None]  # always last
    try:
        present.sort(key=get, reverse=descending)
    except TypeError:  # mixed types in one column
        present.sort(key=lambda r: str(get(r)), reverse=descending)
    return present + missing


def _nested(rows: list[dict], key: str, descending: bool) -> list[dict]:
    """Runs and sweeps sorted by `key`, each sweep followed by its trials (sorted by `key`
    too, in trial order where they tie: all of a sweep's trials share its date)."""
    sweeps = {r["run_key"] for r in rows if r["kind"] == "sweep"}
    trials: dict[str, list[dict]] = {}
    top = []
    for r in rows:
        if r["kind"] == "trial" and r["sweep_key"] in sweeps:
            trials.setdefault(r["sweep_key"], []).append(r)
        else:
            top.append(r)
    out = []
    for r in _sorted(top, key, descending):
        out.append(r)
        if r["kind"] == "sweep":
            by_index = sorted(trials.get(r["run_key"], []), key=lambda t: t["trial_index"])
            out += _sorted(by_index, key, descending)
    return out


def _groups(groups: dict[str, list[dict]], champions: set, default_location: str, sort: str,
            descending: bool) -> list[dict[str, Any]]:
    """The experiments table's groups: rows in page order with their links and marks."""
    out = []
    for experiment, rows in groups.items():
        shown = []
        for r in _nested(rows, sort, descending):
            shown.append({**r, "champion": (r["export_location"], r["model_name"],
                                            r["version"]) in champions,
                          "card_href": _run_card_href("", r, default_location)})
        kinds = [r["kind"] for r in rows]
        out.append({"name": experiment, "rows": shown,
                    "summary": _counted(kinds.count("run"), kinds.count("sweep"),
                                        kinds.count("trial"))})
    return out


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _counted(runs: int, sweeps: int, trials: int) -> str:
    """A group heading's count: '2 runs', '1 sweep of 2 trials', '3 runs, 1 sweep of 4
    trials'."""
    parts = [_plural(runs, "run")] if runs or not sweeps else []
    if sweeps:
        parts.append(f"{_plural(sweeps, 'sweep')} of {_plural(trials, 'trial')}")
    return ", ".join(parts)


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
    for m in models:
        for v in m["versions"]:
            v["card_href"] = _card_href("", m["model"], v["version"], m["location_id"],
                                        m["default_location"])
            v["lineage_href"] = f"models/{_link(m['model'], v['version'])}{_location_query(m)}"
    descending = order == "desc"
    columns = [{"key": key, "title": title, "left": left,
                "order": "asc" if key == sort and descending else "desc"}
               for key, title, _, left in COLUMNS]
    return render("index.html", title="bertflow", root=root, models=models,
                  scoring=run_summary.scoring_runs(root),
                  groups=_groups(groups, champions, locations[0], sort, descending),
                  columns=columns, sort=sort, descending=descending)


# --- the run page ------------------------------------------------------------------------

# The run page's config table: (heading, key of the run's summary: a RunConfig field or a
# figure of its train manifest).
CONFIG_ROWS = [("learning rate", "learning_rate"), ("epochs", "epochs"),
               ("per-replica batch", "per_replica_batch_size"),
               ("global batch", "global_batch_size"), ("max_seq_length", "max_seq_length"),
               ("strategy", "strategy"), ("provisioner", "provisioner"), ("steps", "steps")]
TRAINED = ("global_batch_size", "steps")  # a sweep folder trains nothing: no such figures


def _config_rows(run: dict) -> list[tuple[str, str]]:
    """(heading, text) of the run page's config table. A sweep's searched fields list every
    value its trials took (its own config.json holds only the shared values)."""
    sweep = run["sweep_record"]
    searched: dict[str, list] = {}
    for trial in (sweep or {}).get("trials") or []:
        for name, value in trial["values"].items():
            if value not in searched.setdefault(name, []):
                searched[name].append(value)

    def values(name: str) -> str:
        return "searched: " + ", ".join(exact(v) for v in searched[name])

    rows = [("experiment", fmt(run["experiment"])),
            ("logical date", run["logical_date"] or "–"), ("run id", run["run_id"] or "–")]
    for heading, key in CONFIG_ROWS:
        if sweep is None or key not in TRAINED:
            rows.append((heading, values(key) if key in searched else fmt(run[key])))
    tabled = {key for _, key in CONFIG_ROWS}
    rows += [(name, values(name)) for name in searched if name not in tabled]
    if sweep is None:  # a sweep's training figures are its best trial's (its page shows them)
        rows += [("train time", duration(run["train_seconds"])),
                 ("examples/s", fmt(run["examples_per_second"])),
                 ("goodput", fmt(goodput.describe(run["goodput_detail"])))]
    if run.get("long_texts"):
        rows.append(("long texts", run["long_texts"]))
    rows.append(("steps done", ", ".join(run["steps_done"]) or "–"))
    return rows


# The metrics of tasks other than classification, in the order the run page lists them.
OTHER_METRICS = ("micro_f1", "f1", "macro_f1", "subset_accuracy", "precision", "recall",
                 "pearson", "spearman", "mse", "truncated_sentences")


def _outcome(root: str, run: dict) -> dict[str, Any]:
    """What the run page's Training, Evaluation and Model sections draw of `run` (a run, or
    a sweep's best trial): charts, confusion matrix, per-class rows, the exported version
    with its card link and location, the gate's decision and the promotion."""
    metrics = run["metrics"]
    labels = (metrics or {}).get("labels")
    labels = [str(x) for x in labels] if isinstance(labels, list) else []
    # classification's per class, multi-label's per label, entities' per type: one table
    per_type = (metrics or {}).get("per_type")
    per_class = ((metrics or {}).get("per_class") or (metrics or {}).get("per_label")
                 or per_type)
    default = run_summary.default_location(root)
    tb_dir = run["train"].get("tensorboard_dir") or join_uri(run["uri"], "train",
                                                             "tensorboard")
    gate = run["gate"]
    return {
        "run": run, "charts": charts.run_charts(run["history"], run.get("history_meta")),
        "metrics": metrics,
        "confusion": charts.confusion((metrics or {}).get("confusion_matrix"), labels),
        # multi-label and regression runs name their own metrics (tasks/task_kinds.py)
        "headline": [] if "accuracy" in (metrics or {}) else [
            (name, metrics[name]) for name in OTHER_METRICS
            if isinstance((metrics or {}).get(name), (int, float))],
        "scatter": charts.predicted_vs_true((metrics or {}).get("binned")),
        "per_class": [(label, m) for label, m in (per_class or {}).items()
                      if isinstance(m, dict)] if isinstance(per_class, dict) else [],
        "per_class_title": "entity type" if per_type else "label",
        "tensorboard_dir": str(tb_dir),
        "card_href": _run_card_href("../../", run, default),
        "elsewhere": None if run["export_location"] == default else run["export_location"],
        "gate": {"passed": gate.get("passed"), "reason": gate.get("reason")} if gate else None,
        "comparison": comparison_table(run.get("comparison")),
        "mlflow": run.get("mlflow"),
    }


def comparison_table(record) -> dict | None:
    """gate_eval's record as the run page's table: both models' metrics on the same test
    rows, and the classes whose F1 moved most; None when there was no champion to compare
    (or the record is damaged)."""
    if not isinstance(record, dict) or not record.get("comparable"):
        return None
    try:
        ours, theirs = record["metrics"]["candidate"], record["metrics"]["champion"]
        rows = [(name, ours[name], theirs[name], ours[name] - theirs[name])
                for name in ours if isinstance(ours[name], (int, float))
                and isinstance(theirs.get(name), (int, float))]
        per_class = record.get("per_class") or {}
        moved = sorted(((name, m["f1"], per_class["champion"][name]["f1"],
                         m["f1"] - per_class["champion"][name]["f1"], m["support"])
                        for name, m in (per_class.get("candidate") or {}).items()
                        if name in (per_class.get("champion") or {})),
                       key=lambda row: row[3])[:CLASSES_SHOWN]
        difference = record["difference"]
        return {"champion": record["champion"]["version"], "units": record["units"],
                "unit": record.get("unit", "rows"), "metric": record["metric"], "rows": rows,
                "interval": (difference["low"], difference["high"]), "classes": moved}
    except (KeyError, TypeError, AttributeError):
        return None


CLASSES_SHOWN = 5  # the classes whose F1 the candidate lowered most (or raised least)


@app.get("/runs/{dag_id}/{run_key}", response_class=HTMLResponse)
def run_page(dag_id: str, run_key: str) -> str:
    _checked(dag_id, run_key)
    root = default_artifact_root()
    if (dag_id, run_key) not in run_summary.list_runs(root):
        raise HTTPException(404, "no such run folder")
    run = run_summary.run_detail(root, dag_id, run_key)
    is_sweep = run["sweep_record"] is not None
    shown = run["best"] if is_sweep else run
    trials = run["sweep"]
    compare_all = None
    if trials and len(trials) > 1:
        compare_all = _compare_href("../../", [f"{dag_id}/{t['run_key']}" for t in trials])
    return render(
        "run.html", title=f"bertflow run {dag_id} / {run_key}", dag_id=dag_id,
        run_key=run_key, run=run, is_sweep=is_sweep, config=_config_rows(run),
        # A sweep folder trains nothing to compare: its trials are (compare_all).
        compare_with={"links": [], "all": None} if is_sweep else
        _compare_links(root, dag_id, run_key, run["experiment"]),
        trials=trials, compare_all=compare_all,
        logs=run_summary.log_groups(root, dag_id, run_key, run["logs"]),
        outcome=_outcome(root, shown) if shown is not None else None)


def _compare_links(root: str, dag_id: str, run_key: str, experiment: str) -> dict[str, Any]:
    """The run page's "compare with…": each other run of its experiment (trials by their
    values; not sweep folders, which train nothing), all of them, and the index."""
    this = f"{dag_id}/{run_key}"
    others = [(f"{r['dag_id']}/{r['run_key']}", r["label"])
              for r in run_summary.experiments(root).get(experiment, [])
              if (r["dag_id"], r["run_key"]) != (dag_id, run_key) and r["kind"] != "sweep"]
    links = [{"href": _compare_href("../../", [this, ref]), "text": str(label)}
             for ref, label in others]
    every = None
    if len(others) > 1:
        refs = [this] + [ref for ref, _ in others]
        every = {"href": _compare_href("../../", refs),
                 "text": f"all {len(refs)} runs of experiment {experiment}"}
    return {"links": links, "all": every}


@app.get("/runs/{dag_id}/{run_key}/logs/{step}/{name}", response_class=PlainTextResponse)
def worker_log(dag_id: str, run_key: str, step: str, name: str) -> str:
    """A worker's log, an attempt's own or the newest; only one the run folder lists
    (run_summary.worker_logs), so no name reaches outside {run}/{step}/logs/."""
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

@app.get("/models/{model}/{version}", response_class=HTMLResponse)
def version_page(model: str, version: str, location: str | None = None) -> str:
    """Which data, config, checkpoint and code produced this version."""
    _checked(model, version)
    root = default_artifact_root()
    where = _location(root, location)
    if (model, version) not in run_summary.list_versions_at(where):
        raise HTTPException(404, "no such complete model version")
    record = lineage.read(join_uri(where, model, version))
    run_href = None
    if record is not None:
        dag_id, run_key = str(record.get("dag_id")), str(record.get("run_key") or "")
        if run_summary.valid_name(dag_id) and run_summary.valid_name(run_key):
            run_href = f"../../runs/{_link(dag_id, run_key)}"
    return render("version.html", title=f"bertflow {model} {version}", model=model,
                  version=version, uri=join_uri(where, model, version), record=record,
                  splits=[(split, src) for split, src in ((record or {}).get("data") or {})
                          .items() if isinstance(src, dict)],
                  base=(record or {}).get("base_model") or {},
                  code=(record or {}).get("code") or {},
                  metrics=(record or {}).get("metrics") or {},
                  config=sorted(((record or {}).get("config") or {}).items()),
                  run_href=run_href, prefix="../../")


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
                    hashes = [str(src.get("sha256", ""))[:12]
                              for src in (record.get("data") or {}).values()
                              if isinstance(src, dict)]
                    found.append({"model": m["model"], "version": v["version"],
                                  "href": f"models/{_link(m['model'], v['version'])}"
                                          f"{_location_query(m)}",
                                  "run_id": record.get("run_id"), "accuracy": v["accuracy"],
                                  "hashes": ", ".join(hashes)})
    return render("data.html", title="bertflow data", q=q, searched=bool(q.strip()),
                  found=found)


# --- the compare page ------------------------------------------------------------------------

@app.get("/compare", response_class=HTMLResponse)
def compare_page(run: list[str] = Query(default=[])) -> str:
    """Runs side by side: `?run=dag_id/run_key&run=...` (two or more run folders)."""
    root = default_artifact_root()
    try:
        shown = compare.compare(root, compare.parse_refs(run))
    except compare.CompareError as err:
        raise HTTPException(err.status, str(err)) from None
    runs = shown["runs"]
    for i, r in enumerate(runs):
        dag_id, run_key = r["ref"].split("/")
        trial = run_summary.trial_of(root, dag_id, run_key)
        r.update(color=charts.run_color(i), href=f"runs/{_link(dag_id, run_key)}",
                 trial_label=trial["label"] if trial else None,
                 matrix=_matrix(r["evaluation"]))
    overlays = (charts.line_chart([(r["ref"], r["color"], r["curves"].get(key, []))
                                   for r in runs], key.replace("_", " "), key)
                for key in shown["series"])
    return render("compare.html", title="bertflow compare", runs=runs,
                  charts=[c for c in overlays if c is not None],
                  sections=[("config", shown["config_differing"], shown["config_equal"]),
                            ("metrics", shown["metrics_differing"],
                             shown["metrics_equal"])],
                  absent=compare.ABSENT)


def _matrix(metrics: dict | None) -> dict[str, Any] | None:
    """A run's confusion matrix as table rows (its own labels, so runs of different label
    sets compare); None unless evaluate/metrics.json holds a square one."""
    metrics = metrics or {}
    labels = [str(x) for x in metrics.get("labels") or []]
    matrix = metrics.get("confusion_matrix")
    if not labels or not isinstance(matrix, list) or len(matrix) != len(labels) or any(
            not isinstance(row, list) or len(row) != len(labels) for row in matrix):
        return None
    return {"labels": labels, "rows": list(zip(labels, matrix))}
