"""benchmarks/evaluation_floor.py's bertflow worker: the parts of the evaluation of a trained
run's model, in a fresh process, printed as one `RESULT {json}` line.

    PYTHONPATH=benchmarks ./.venv/bin/python benchmarks/workers/_bertflow_eval_worker.py RUN_DIR \
        [--no-graph-optimization]

On the run's saved model and evaluation shards, under the run's strategy (one device here):
1. `evaluate_model` once, as the evaluate step runs it (`evaluate_model_s`; this process's
   first evaluation, so it traces);
2. the same evaluation again in its parts: the input pipeline's build, the trace of the
   evaluation loop (`get_concrete_function`), its first run and a second run (`steady_run_s`:
   nothing left to trace, oneDNN's primitives cached);
3. one pass of the forward in eager mode over the same batches (`eager_forward_s`: no trace,
   no graph), after one untimed pass.
Classification only (the confusion-matrix loop). `--no-graph-optimization` turns TensorFlow's
graph optimizer (Grappler) off for the whole process, before anything runs: what is left of
the first run's extra cost is the runtime's own (oneDNN's rewrite and primitives stay)."""
from __future__ import annotations

import argparse
import json

import tasks  # noqa: F401  (bertflow's TensorFlow settings, before TensorFlow)
from lib.common import timed
from tasks.runs.runlayout import load_run, read_manifest
from tasks.steps import evaluate
from tasks.training import checkpoint, inputs, model as model_lib, strategy as strategy_lib


def main(run_dir: str, graph_optimization: bool = True) -> dict:
    if not graph_optimization:
        import tensorflow as tf
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    cfg, ctx = load_run(run_dir)
    strategy, name = strategy_lib.build_strategy(cfg)
    device = strategy_lib.device_kind(cfg, name)
    model_lib.set_precision(cfg, device)
    tok = read_manifest(ctx.manifest_uri("tokenize"))
    trained = read_manifest(ctx.manifest_uri("train"))
    if tok.get("task", "classification") != "classification":
        raise SystemExit(f"{run_dir}: classification runs only, not {tok['task']}")
    labels = tok["labels"]
    with strategy.scope():
        model = checkpoint.load_classifier(
            trained["model_dir"], labels, cpu_kernels=strategy_lib.use_cpu_kernels(device, name))
    whole, metrics = timed(lambda: evaluate.evaluate_model(cfg, tok, strategy, name, model))
    batch = cfg.eval_batch_size * strategy.num_replicas_in_sync
    with inputs.local_shards(tok, "eval") as files:
        build, data = timed(lambda: evaluate.eval_data(
            strategy, files, batch, False, cfg.max_seq_length, None))
        loop = evaluate.count_loop(strategy, model, data,
                                   evaluate.confusion_counts(len(labels)))
        trace, _ = timed(loop.get_concrete_function)
        first_s, first = timed(lambda: loop().numpy())
        steady, again = timed(lambda: loop().numpy())
        batches = list(inputs.eval_dataset(files, batch, None, False, cfg.max_seq_length))

    def eager_pass():
        for features, _ in batches:
            model(features, training=False).numpy()

    eager_pass()  # untimed: the first eager call builds each layer's kernels' state
    eager, _ = timed(eager_pass)
    assert int(first.sum()) == int(again.sum()) == metrics["num_examples"]
    return {"num_examples": metrics["num_examples"], "batches": len(batches),
            "eval_batch_size": batch, "evaluate_model_s": whole, "input_build_s": build,
            "trace_s": trace, "first_run_s": first_s, "steady_run_s": steady,
            "eager_forward_s": eager}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--no-graph-optimization", action="store_true")
    args = ap.parse_args()
    print("RESULT " + json.dumps(main(args.run_dir, not args.no_graph_optimization)),
          flush=True)
