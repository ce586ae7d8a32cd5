"""The Airflow trigger form, derived from RunConfig: the form's sections and one Param's JSON
schema per field (`param_schemas()`, the keyword arguments `airflow.sdk.Param` takes).

Kept free of Airflow imports so it can be tested and reused (docs/params.md is rendered from
it by tasks/params_doc.py). A field is declared once, in tasks/config.py; here it is only
placed in a section.
"""
from __future__ import annotations

from typing import Any

from tasks.config import RunConfig

# The trigger form's sections, in order (Airflow draws one box per Param `section`). The first
# holds what a first-time user changes: its fields carry no `section`, so they land in the
# form's default box, "Run Parameters", the one Airflow shows open; the others start collapsed,
# and "(advanced)" ones can stay at their defaults.
FIRST_SECTION = "Run Parameters"
SECTIONS: dict[str, tuple[str, ...]] = {
    FIRST_SECTION: ("experiment", "task", "train_uri", "test_uri", "labels", "epochs",
                   "accelerator", "num_workers", "provisioner"),
    "Data": ("file_format", "text_column", "text_pair_column", "label_column", "tag_column",
             "label_delimiter", "eval_fraction", "fail_on_leakage", "seed", "eval_uri"),
    "Validation and early stopping": (
        "validation_uri", "validation_fraction", "eval_every_steps", "eval_every_epoch",
        "best_checkpoint", "early_stopping_patience", "early_stopping_min_delta"),
    "Model": ("base_model", "max_seq_length", "long_text", "window_stride",
              "window_aggregation", "lower_case", "lower_case_override", "num_shards"),
    "Workers": ("strategy", "devices_per_worker", "num_ps", "tpu_address", "tpu_zone",
                "tpu_project"),
    "Training": ("training_loop", "per_replica_batch_size", "max_steps", "learning_rate",
                 "warmup_ratio", "weight_decay", "mixed_precision", "deterministic",
                 "group_by_length"),
    "Export and quality gate": ("export_uri", "model_name", "gate_metric", "gate_min_value",
                                "gate_max_regression", "gate_per_class_max_regression",
                                "gate_per_class_min_support", "require_approval",
                                "approval_timeout_minutes"),
    "Remote workers (advanced)": (
        "worker_image", "image_registry", "accelerator_type", "tpu_topology", "machine_type",
        "worker_cpu", "worker_memory", "k8s_conn_id", "k8s_namespace", "service_account",
        "image_pull_secrets", "node_selector", "tolerations", "gcp_project", "gcp_region",
        "network", "tpu_runtime_version", "tpu_external_ips", "worker_timeout_minutes",
        "schedule_timeout_seconds", "capacity", "reservation", "k8s_platform",
        "capacity_cpu_steps", "max_preemptions"),
    "Training (advanced)": ("lr_schedule", "lr_power", "label_smoothing", "class_weights",
                            "loss_normalizer",
                            "multi_label_threshold", "decision_threshold",
                            "decision_threshold_metric", "freeze", "layer_lr_decay",
                            "head_learning_rate", "lr_scaling",
                            "reference_batch_size", "grad_accum_steps", "max_grad_norm",
                            "checkpoint_every_steps", "eval_batch_size", "evaluate_in_train"),
    "Storage and connections (advanced)": ("artifact_root", "gcp_conn_id", "aws_conn_id",
                                           "hf_conn_id"),
    "Experiment tracking (advanced)": ("mlflow_tracking_uri", "mlflow_conn_id"),
}



# Each Param's schema names its draft. Airflow validates a Param's value with
# jsonschema.validate, which first checks the schema against its draft's meta-schema, and does
# so for every field each time it serializes a DAG (the DAG processor, on every parse) and for
# every task: with no "$schema", jsonschema takes the newest draft (2020-12, seven vocabularies),
# and serializing bert_finetune cost 2.9x the CPU it does under draft 7's flat meta-schema
# (benchmarks/results/dag_parse.json). The keywords used here mean the same in both
# (tests/test_config.py checks the form's schemas against both).
DRAFT = {"$schema": "http://json-schema.org/draft-07/schema#"}


# bert_batch_score's form (tasks/score_config.py), laid out the same way.
SCORE_SECTIONS: dict[str, tuple[str, ...]] = {
    FIRST_SECTION: ("input_uri", "model", "output_uri", "num_workers", "provisioner",
                    "accelerator"),
    "Input": ("file_format", "text_column", "text_pair_column", "id_column"),
    "Model and output": ("model_name", "export_uri", "expected_task", "output_format",
                         "batch_size", "shard_rows", "peer_wait_seconds",
                         "max_error_rows"),
    "Remote workers (advanced)": (
        "worker_image", "image_registry", "accelerator_type", "machine_type", "worker_cpu",
        "worker_memory", "k8s_conn_id", "k8s_namespace", "service_account",
        "image_pull_secrets", "node_selector", "tolerations", "gcp_project", "gcp_region",
        "network", "worker_timeout_minutes", "schedule_timeout_seconds", "capacity",
        "reservation", "k8s_platform", "max_preemptions"),
    "Storage and connections (advanced)": ("artifact_root", "gcp_conn_id", "aws_conn_id"),
}


def score_param_schemas() -> dict[str, dict[str, Any]]:
    """param_schemas() of the scoring DAG's ScoreConfig."""
    from tasks.score_config import ScoreConfig

    return param_schemas(ScoreConfig, SCORE_SECTIONS)


def param_schemas(model=RunConfig, sections: dict[str, tuple[str, ...]] = SECTIONS
                  ) -> dict[str, dict[str, Any]]:
    """JSON-schema keyword arguments per field of `model`, in the shape airflow.sdk.Param
    takes, in `sections` order (the trigger form keeps a section's fields together only if
    they are adjacent)."""
    listed = [name for names in sections.values() for name in names]
    if sorted(listed) != sorted(model.model_fields):
        raise RuntimeError(f"tasks.params_form: the sections must list every {model.__name__} "
                           f"field once: {sorted(set(model.model_fields) ^ set(listed))}")
    schema = model.model_json_schema()
    out: dict[str, dict[str, Any]] = {}
    defaults = model().model_dump()
    for section, name in ((s, n) for s, names in sections.items() for n in names):
        prop = schema["properties"][name]
        kwargs: dict[str, Any] = {}
        if "anyOf" in prop:  # Optional[X] -> type [X, "null"]
            types = [p.get("type") for p in prop["anyOf"]]
            # A number or a word (`tuned`): type [number, string], the number's range (it
            # binds numbers only); Airflow's form reads such a field's text as JSON, else text.
            inner = next(p for p in prop["anyOf"] if p.get("type") != "null" and
                         "const" not in p)
            kwargs.update({k: v for k, v in inner.items() if k != "type"})
            kwargs["type"] = [t for t in types if t]
            if "enum" in kwargs and "null" in kwargs["type"]:  # Optional[Literal[...]]
                kwargs["enum"] = [*kwargs["enum"], None]
        else:
            kwargs.update({k: v for k, v in prop.items() if k not in ("default",)})
        kwargs.pop("title", None)
        kwargs["title"] = prop.get("title", name)
        if "description" in prop:
            kwargs["description"] = prop["description"]
        kwargs["default"] = defaults[name]
        if kwargs["default"] == "" and kwargs.get("type") == "string":
            # The trigger form treats "" as missing and would mark the field required.
            kwargs["type"] = ["string", "null"]
        if "const" in kwargs:  # a Literal with one value
            kwargs["enum"] = [kwargs.pop("const")]
        if section != FIRST_SECTION:
            kwargs["section"] = section
        out[name] = {**DRAFT, **kwargs}
    return out
