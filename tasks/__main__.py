"""Command line: `python -m tasks <step> --run-dir RUN_URI` and `python -m tasks init-run`.

The same entry point runs a step in an Airflow task's worker subprocess, a Kubernetes pod, a
TPU VM or a shell. A step reads the run's `config.json` and `context.json` and prints the URI of
the manifest it wrote. Errors a user can fix exit 2 with one line on stderr.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import typing

from tasks import process_start
from tasks.provision import launcher
from tasks.io import storage
from tasks.config import RunConfig, parse_config
from tasks.errors import BertflowError, ConfigError
from tasks.steps import validate
from tasks.runs.runlayout import RunContext, init_run, load_run, write_run_config

# Step name -> module with run(cfg, ctx); imported only when that step runs, so `--help` and
# light steps never load TensorFlow.
STEPS = {
    "data": "tasks.steps.data",
    "tokenize": "tasks.steps.tokenize",
    "provision": "tasks.steps.provision",
    "train": "tasks.steps.train",
    "evaluate": "tasks.steps.evaluate",
    "release": "tasks.steps.release",
    "export": "tasks.steps.export",
    "gate_eval": "tasks.steps.gate_eval",
    "promote": "tasks.steps.promote",
    "score": "tasks.steps.score",
}


def run_step(step: str, run_uri: str) -> str:
    cfg, ctx = load_run(run_uri)
    with process_start.imports_out_of_collection():
        module = importlib.import_module(STEPS[step])
    return module.run(cfg, ctx)


# --- init-run flags, generated from RunConfig ------------------------------------------------
def _is_list(annotation) -> bool:
    return any(typing.get_origin(a) is list
               for a in (annotation, *typing.get_args(annotation)))


def _is_dict(annotation) -> bool:
    return any(typing.get_origin(a) is dict
               for a in (annotation, *typing.get_args(annotation)))


def _is_text(annotation) -> bool:
    """str, Optional[str] and Literal["a", ...] fields: their flag values stay strings."""
    args = (annotation, *typing.get_args(annotation))
    return any(a is str or typing.get_origin(a) is typing.Literal for a in args)


def _add_config_flags(parser: argparse.ArgumentParser, model=RunConfig) -> None:
    group = parser.add_argument_group("run configuration (each flag overrides --config)")
    for name, field in model.model_fields.items():
        default = field.get_default(call_default_factory=True)
        help_text = f"{field.title or name}. {field.description or ''} (default: {default!r})"
        metavar = ("A,B,..." if _is_list(field.annotation) else
                   "JSON" if _is_dict(field.annotation) else "VALUE")
        # Both spellings: --max-seq-length (conventional) and --max_seq_length (the field).
        flags = dict.fromkeys([f"--{name.replace('_', '-')}", f"--{name}"])
        group.add_argument(*flags, dest=f"cfg_{name}", metavar=metavar,
                           help=help_text.replace("%", "%%"))


def _flag_values(args: argparse.Namespace, model=RunConfig) -> dict:
    values = {}
    for name, field in model.model_fields.items():
        raw = getattr(args, f"cfg_{name}")
        if raw is None:
            continue
        if _is_list(field.annotation) and raw.startswith("["):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as err:
                raise ConfigError(name, f"not a JSON list ({err})") from None
        elif _is_list(field.annotation) and raw != "":
            raw = [v.strip() for v in raw.split(",")]
        elif _is_dict(field.annotation) and raw != "":
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as err:
                raise ConfigError(name, f"not a JSON object ({err})") from None
        elif not _is_text(field.annotation):
            # Numbers and booleans as JSON (so errors quote 4096, not '4096'); parse_config
            # then validates them exactly like Params and config files.
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                pass
        values[name] = raw
    return values


def _run_context(run_dir: str, dag_id: str | None, run_key: str | None,
                 cfg: RunConfig) -> RunContext:
    """The context of a new run folder. `{artifact_root}/runs/{dag_id}/{run_key}` is read as
    such (the given ids and artifact_root must agree with it); any other folder is taken as
    it is, its run key its last path segment."""
    parts = run_dir.rstrip("/").rsplit("/", 3)
    if len(parts) == 4 and parts[1] == "runs":
        root, _, found_dag, found_key = parts
        for flag, given, found in (("dag-id", dag_id, found_dag),
                                   ("run-key", run_key, found_key)):
            if given is not None and given != found:
                raise ConfigError(flag, f"{given!r} does not match the run folder ({found!r})")
        if cfg.artifact_root.rstrip("/") != root:
            raise ConfigError("artifact_root", f"{cfg.artifact_root} differs from the run "
                                               f"folder's root {root}")
        return RunContext(artifact_root=root, dag_id=found_dag, run_key=found_key,
                          run_id=found_key, experiment=cfg.experiment)
    key = run_key or run_dir.rstrip("/").rsplit("/", 1)[-1]
    return RunContext(artifact_root=cfg.artifact_root.rstrip("/"), dag_id=dag_id or "manual",
                      run_key=key, run_id=key, experiment=cfg.experiment,
                      run_dir=run_dir.rstrip("/"))


def _init_run_command(args: argparse.Namespace) -> str:
    values = json.loads(storage.read_text(args.config)) if args.config else {}
    values.update(_flag_values(args))
    parts = args.run_dir.rstrip("/").rsplit("/", 3)
    if len(parts) == 4 and parts[1] == "runs":  # the run folder names its artifact root
        values.setdefault("artifact_root", parts[0])
    cfg = parse_config(values)
    ctx = _run_context(args.run_dir, args.dag_id, args.run_key, cfg)
    # The DAG's validate checks that need no backend (tasks/steps/validate.py): inputs,
    # checkpoint, memory, capacity; `validate` adds the backend's once the folder exists.
    return init_run(validate.check_inputs_and_model(cfg), ctx)


def _init_score_command(args: argparse.Namespace) -> str:
    """A scoring run folder: its config checked, the model resolved, the plan made
    (tasks/scoring/plan.py), as bert_batch_score's validate task does."""
    from tasks.score_config import ScoreConfig, parse_score_config, run_config
    from tasks.scoring.plan import make_plan

    values = json.loads(storage.read_text(args.config)) if args.config else {}
    values.update(_flag_values(args, ScoreConfig))
    cfg = parse_score_config(values)
    key = args.run_dir.rstrip("/").rsplit("/", 1)[-1]
    ctx = RunContext(artifact_root=cfg.artifact_root, dag_id="manual", run_key=key, run_id=key,
                     run_dir=args.run_dir.rstrip("/"))
    init_run(run_config(cfg), ctx)
    plan = make_plan(cfg, ctx)
    return (f"{ctx.run_uri}: {plan['rows']} rows in {len(plan['shards'])} shard(s) for "
            f"model {plan['model']['version']}; next: python -m tasks score --run-dir "
            f"{ctx.run_uri}, then publish-scores")


def _validate_command(run_dir: str) -> str:
    """Every check of the DAG's validate task on an existing run folder (config.json)."""
    cfg, ctx = load_run(run_dir)
    checked = validate.check_run(cfg.model_copy(), ctx)
    if checked.base_model != cfg.base_model:  # pinned or staged: what every step starts from
        write_run_config(ctx, checked)
    return f"{run_dir}: the run's inputs, checkpoint and {cfg.provisioner} backend check out"


def _preflight_command(run_dir: str) -> int:
    from tasks.provision.backends import backend_for
    from tasks.provision import preflight

    cfg, ctx = load_run(run_dir)
    backend = backend_for(cfg)
    backend.check(cfg, ctx)
    try:
        result = preflight.run(cfg, ctx, backend)
    except preflight.PreflightError as err:
        print(preflight.summary(err.result))
        print(f"bertflow: error: {err}", file=sys.stderr)
        return 2
    print(preflight.summary(result))
    print(f"preflight: {preflight.counts(result)}; result in "
          f"{preflight.result_uri(ctx)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tasks", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for step in STEPS:
        p = sub.add_parser(step, help=f"run the {step} step")
        p.add_argument("--run-dir", required=True, help="run folder URI")
        if step == "provision":
            p.add_argument("--dry-run", action="store_true",
                           help="print what the configured backend (provisioner) would "
                                "create, touching no cloud and writing nothing")
    check = sub.add_parser("validate", help="check a run folder's config as the DAG's validate "
                                            "task does (inputs, checkpoint, memory, capacity, "
                                            "backend) before any step runs")
    check.add_argument("--run-dir", required=True, help="run folder URI")
    check = sub.add_parser("preflight", help="check buckets and platform permissions of a run "
                                             "without creating anything that costs money")
    check.add_argument("--run-dir", required=True, help="run folder URI")
    init = sub.add_parser("init-run", help="create a run folder (config.json, context.json)")
    init.add_argument("--run-dir", required=True,
                      help="the run folder to create: any local path or gs:// / s3:// URI "
                           "({artifact_root}/runs/{dag_id}/{run_key} is read as such)")
    init.add_argument("--dag-id", help="checked against the run folder")
    init.add_argument("--run-key", help="checked against the run folder")
    init.add_argument("--config", help="JSON file (URI) with config fields")
    _add_config_flags(init)
    from tasks.score_config import ScoreConfig

    init = sub.add_parser("init-score", help="create a batch-scoring run folder: check the "
                                             "input, the model and the output, plan the shards")
    init.add_argument("--run-dir", required=True, help="the run folder to create")
    init.add_argument("--config", help="JSON file (URI) with scoring config fields")
    _add_config_flags(init, ScoreConfig)
    publish = sub.add_parser("publish-scores", help="check a scoring run's shards and write "
                                                    "its _COMPLETE.json")
    publish.add_argument("--run-dir", required=True, help="run folder URI")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "init-run":
            print(_init_run_command(args))
        elif args.command == "init-score":
            print(_init_score_command(args))
        elif args.command == "publish-scores":
            from tasks.scoring.publish import publish

            print(json.dumps(publish(load_run(args.run_dir)[1]), indent=2))
        elif args.command == "validate":
            print(_validate_command(args.run_dir))
        elif args.command == "preflight":
            return _preflight_command(args.run_dir)
        elif getattr(args, "dry_run", False):
            from tasks.steps.provision import dry_run
            print(dry_run(*load_run(args.run_dir), warn=lambda msg: print(
                f"bertflow: warning: {msg}", file=sys.stderr)))
        else:
            # Remote workers (Kubernetes pods) get their TF_CONFIG built here from their
            # role and index (tasks/provision/launcher.py); local processes and Vertex AI set it.
            launcher.apply(os.environ)
            print(run_step(args.command, args.run_dir))
    except BertflowError as err:
        print(f"bertflow: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    code = main()  # an uncaught exception ends the usual way, with its traceback
    from tasks import process_end

    process_end.finish()
    os._exit(code)
