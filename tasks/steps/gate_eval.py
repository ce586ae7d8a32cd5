"""Gate evaluation step: the candidate and the current champion scored on the same test rows.

The gate used to compare the candidate's metric with the figure stored when the champion
was promoted, measured on that run's own test split: other rows. This step scores both
exported versions here, through their SavedModels' serving signatures on the raw test texts
(the data step's eval split), so a champion with another tokenizer, sequence length or
family is scored as it serves. It writes both models' metrics (per class too) and a paired
bootstrap of the gate metric's difference (tasks/gate/bootstrap.py) to
`gate_eval/manifest.json`; promote's gate decides from it (tasks/steps/promote.py).

A champion that cannot be compared (another task, other labels, other inputs, a version
that is gone) is recorded as such with the reason; the gate then uses the first-model rule.
"""
from __future__ import annotations

import json

import numpy as np

from tasks.config import RunConfig
from tasks.errors import StorageError
from tasks.gate import unit_scores
from tasks.gate.bootstrap import paired_difference
from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.runs import runlayout
from tasks.runs.runlayout import RunContext
from tasks.steps import promote
from tasks.steps.prepared import TokenRow, read_prepared_rows
from tasks.task_kinds import kind as task_kind

STEP = "gate_eval"
SERVING_BATCH = 64  # texts per call of a serving signature


def run(cfg: RunConfig, ctx: RunContext) -> str:
    data = runlayout.read_manifest(ctx.manifest_uri("data"))
    exported = runlayout.read_manifest(ctx.manifest_uri("export"))
    version_uri = exported["version_uri"]
    kind = task_kind(data.get("task", "classification"))
    current = storage.read_versioned(promote.champion_uri(cfg))
    champion = json.loads(current[0]) if current else None
    result = {"version_uri": version_uri, "version": exported["version"],
              "champion": promote.without_history(champion), "metric": cfg.gate_metric_name,
              "comparable": False, "test_sha256": _test_sha256(data)}
    if champion is None:
        result["reason"] = "no champion yet"
    elif champion["version_uri"] == version_uri:
        result["reason"] = f"{exported['version']} is already the champion"
    else:
        result["reason"] = incomparable(champion["version_uri"], kind.name, data)
    if result["reason"]:
        return runlayout.write_manifest(ctx.step_uri(STEP), result)

    rows = read_test_rows(data, kind.per_token)
    wanted = {"text", "text_pair"} if data["has_pair"] else {"text"}
    scored = {}
    for side, uri in (("candidate", version_uri), ("champion", champion["version_uri"])):
        with storage.staged_local_dir(join_uri(uri, "saved_model")) as saved_model:
            loaded = load_saved_model(str(saved_model))  # kept: it owns the variables
            serve = loaded.signatures["serving_default"]
            inputs = set(serve.structured_input_signature[1])
            if inputs != wanted:
                result["reason"] = (f"the {side} serves {sorted(inputs)}, this run's test "
                                    f"rows have {sorted(wanted)}")
                return runlayout.write_manifest(ctx.step_uri(STEP), result)
            scored[side] = score(serve, rows, data, kind.name)
    result.update(compared(scored, kind.name, cfg.gate_metric_name, cfg.seed))
    return runlayout.write_manifest(ctx.step_uri(STEP), result)


def compared(scored: dict[str, unit_scores.UnitScores], task: str, metric: str,
             seed: int) -> dict:
    """The manifest's fields for two models scored on the same units (`scored`: candidate
    and champion): both sides' metrics and per-class F1, and the paired difference."""
    kind = task_kind(task)
    names = kind.gate_metrics + kind.reported_metrics
    difference = paired_difference(metric, scored["candidate"], scored["champion"], seed=seed)
    reports = {side: s.report() for side, s in scored.items()}
    return {"comparable": True, "reason": "", "units": difference.units,
            "unit": "sentences" if kind.per_token else "rows",
            "metrics": {side: {name: float(report[name]) for name in names}
                        for side, report in reports.items()},
            "per_class": {side: s.per_class_f1(reports[side]) for side, s in scored.items()},
            "difference": difference.as_dict()}


def incomparable(champion_uri: str, task: str, data: dict) -> str:
    """Why the champion's version cannot be scored on this run's test rows ("" if it can)."""
    try:
        labels = storage.read_json(join_uri(champion_uri, "labels.json"))
        metrics = storage.read_json(join_uri(champion_uri, "metrics.json"))
    except (StorageError, ValueError) as err:
        return f"the champion's version cannot be read ({err})"
    if metrics.get("task", "classification") != task:
        return f"the champion is a {metrics.get('task')} model, this run is {task}"
    if task != "regression" and sorted(labels) != sorted(data["labels"]):
        return (f"the champion's labels ({len(labels)}) differ from this run's "
                f"({len(data['labels'])}): {sorted(set(labels) ^ set(data['labels']))[:5]}")
    return ""


def _test_sha256(data: dict) -> str | None:
    """The content hash of the test rows' source: the test file, or the training file the
    test split was held out of (with the split rule)."""
    sources = data.get("sources") or {}
    source = sources.get("eval") or sources.get("train") or {}
    return source.get("sha256")


def read_test_rows(data: dict, per_token: bool) -> list:
    """The test split's prepared rows (PreparedRow, or TokenRow for entities), in order."""
    shards = data["splits"]["eval"]["shards"]
    return [row for block in read_prepared_rows(shards, row_type=TokenRow if per_token else None)
            for row in block]


def load_saved_model(saved_model: str):
    """The SavedModel, loaded as a user's server loads it."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  the tokenizer's ops

    return tf.saved_model.load(saved_model)


def score(serve, rows: list, data: dict, task: str) -> unit_scores.UnitScores:
    """One model's per-unit statistics on `rows`, through its serving signature `serve`."""
    labels = data["labels"]
    if task == "token_classification":
        texts = [" ".join(row.words) for row in rows]
        served = serve_rows(serve, {"text": texts})
        found = [unit_scores.word_spans(
            row.words, served["start"][i][:n], served["end"][i][:n],
            served["entity_group"][i][:n])
            for i, (row, n) in enumerate(zip(rows, served["num_entities"]))]
        return unit_scores.entities([[labels[t] for t in row.tags] for row in rows], found,
                                    labels)
    inputs = {"text": [row.text for row in rows]}
    if data["has_pair"]:
        inputs["text_pair"] = [row.text_pair or "" for row in rows]
    served = serve_rows(serve, inputs)
    if task == "regression":
        return unit_scores.regression([row.label for row in rows], served["score"])
    index = {label: i for i, label in enumerate(labels)}
    if task == "classification":
        return unit_scores.classification([row.label for row in rows],
                                          [index[name] for name in served["label"]], labels)
    truth = np.zeros((len(rows), len(labels)), bool)
    predicted = np.zeros_like(truth)
    for i, row in enumerate(rows):
        truth[i, row.label] = True
        predicted[i, [index[name] for name in served["labels"][i] if name]] = True
    return unit_scores.multi_label(truth, predicted, labels)


def serve_rows(serve, inputs: dict[str, list[str]],
               batch_size: int = SERVING_BATCH) -> dict[str, list]:
    """The signature's outputs for every row, rows as lists (strings decoded). Rows go in
    batches of similar length, the longest first (less padding), and come back in order."""
    import tensorflow as tf

    texts = inputs["text"]
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    out: dict[str, list] = {}
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        result = serve(**{k: tf.constant([v[i] for i in batch]) for k, v in inputs.items()})
        for name, value in result.items():
            array = value.numpy()
            if value.dtype == tf.string:
                array = np.char.decode(array.astype("S"), "utf-8")
            out.setdefault(name, [None] * len(texts))
            for i, row in zip(batch, array.tolist()):
                out[name][i] = row
    return out
