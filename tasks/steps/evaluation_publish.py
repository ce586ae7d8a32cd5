"""The evaluate step's output: `evaluate/metrics.json` and its manifest, from metrics that
are already computed, by the evaluate step's workers or by the train step's
(`evaluate_in_train`).

Pure Python (no TensorFlow): when the train step evaluated, the evaluate task's controller
publishes its metrics itself (bertflow_airflow/worker_operator.py) and starts no workers,
which on Kubernetes, Vertex AI or a TPU VM would be a pod or job started for nothing.
"""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.errors import BertflowError
from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.runs.runlayout import RunContext, read_manifest, write_manifest
from tasks.task_kinds import kind as task_kind


def train_evaluation(cfg: RunConfig, trained: dict) -> dict | None:
    """The train manifest's evaluation when the evaluate step should publish it: the
    `evaluate_in_train` Param on, and the train step evaluated (not under parameter_server)."""
    return trained.get("evaluation") if cfg.evaluate_in_train else None


def from_train(cfg: RunConfig, ctx: RunContext, tok: dict | None = None,
               trained: dict | None = None) -> str | None:
    """Publish the train step's evaluation and return the evaluate manifest's URI; None when
    the train step did not evaluate (the evaluate step's workers must). `tok` and `trained`:
    the tokenize and train manifests, when the caller has read them already."""
    trained = trained or read_manifest(ctx.manifest_uri("train"))
    evaluated = train_evaluation(cfg, trained)
    if evaluated is None:
        return None
    return publish(ctx, tok or read_manifest(ctx.manifest_uri("tokenize")), trained,
                   storage.read_json(evaluated["metrics_uri"]), strategy=trained["strategy"],
                   evaluated_in="train", seconds=evaluated["seconds"])


def check_count(tok: dict, metrics: dict) -> None:
    """Every eval row counted once, as the tokenize manifest lists them."""
    expected = tok["splits"]["eval"]["num_examples"]
    if metrics["num_examples"] != expected:
        raise BertflowError(f"evaluated {metrics['num_examples']} examples but the tokenize "
                            f"manifest lists {expected}; the eval shards changed since "
                            "tokenize ran")


def publish(ctx: RunContext, tok: dict, trained: dict, metrics: dict, *, strategy: str,
            evaluated_in: str, seconds: float) -> str:
    """Check the count, write metrics.json and the evaluate manifest, print the headline.
    The chief's (or the controller's) job: other workers only check the count."""
    check_count(tok, metrics)
    kind = task_kind(metrics["task"])
    step_uri = ctx.step_uri("evaluate")
    metrics_uri = join_uri(step_uri, "metrics.json")
    storage.write_json(metrics_uri, metrics)
    headline = {m: metrics[m] for m in kind.gate_metrics + kind.reported_metrics}
    where = " (evaluated in the train step)" if evaluated_in == "train" else ""
    print("evaluate: " + " ".join(f"{m} {v:.4f}" for m, v in headline.items())
          + f" on {metrics['num_examples']} examples{where}", flush=True)
    return write_manifest(step_uri, {
        "metrics_uri": metrics_uri, "num_examples": metrics["num_examples"],
        "task": kind.name, "metrics": headline, "strategy": strategy,
        "model_dir": trained["model_dir"], "evaluated_in": evaluated_in,
        "evaluation_seconds": round(seconds, 3)})
