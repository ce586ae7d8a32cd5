"""Weights to and from Hugging Face checkpoints in PyTorch's layout, without torch.

One table per family maps the PyTorch module names (as transformers 4.57 names them; the
family's prefix, `bert.` etc., left off) to the model's layers; a table per head does the
same for the head's modules, which carry no prefix. Both directions use the same tables.
A module's parameters follow from its kind: a Dense layer's `weight` is its kernel transposed
(torch's nn.Linear stores [out, in]) and `bias`; a LayerNorm's `weight` and `bias` are gamma
and beta; an embedding table is its own `weight`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras

from tasks.errors import BertflowError
from tasks.model import heads, safetensors_stream
from tasks.model.config import PREFIXES

SAFETENSORS = "model.safetensors"
CONFIG = "config.json"

_BERT_LAYER = {
    "attention.self.query": "attention.query",
    "attention.self.key": "attention.key",
    "attention.self.value": "attention.value",
    "attention.output.dense": "attention.output_dense",
    "attention.output.LayerNorm": "attention_layer_norm",
    "intermediate.dense": "feed_forward.intermediate",
    "output.dense": "feed_forward.output_dense",
    "output.LayerNorm": "output_layer_norm",
}
_BERT_EMBEDDINGS = {
    "embeddings.word_embeddings": "embeddings.word_embeddings",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
    "embeddings.LayerNorm": "embeddings.layer_norm",
}
_BERT_BLOCKS = {f"encoder.layer.{{i}}.{k}": f"blocks.{{i}}.{v}" for k, v in _BERT_LAYER.items()}
_DEBERTA_LAYER = {
    "attention.self.query_proj": "attention.query",
    "attention.self.key_proj": "attention.key",
    "attention.self.value_proj": "attention.value",
    "attention.self.pos_key_proj": "attention.pos_key",
    "attention.self.pos_query_proj": "attention.pos_query",
    **{k: v for k, v in _BERT_LAYER.items() if not k.startswith("attention.self.")},
}
# PyTorch module -> encoder attribute path; "{i}" runs over the layers.
ENCODER_TABLES = {
    "bert": {**_BERT_EMBEDDINGS, **_BERT_BLOCKS, "pooler.dense": "pooler"},
    "electra": {**_BERT_EMBEDDINGS, "embeddings_project": "embeddings.projection",
                **_BERT_BLOCKS},
    # BERT's layout; transformers builds RoBERTa's classifiers without the pooler.
    "roberta": {**_BERT_EMBEDDINGS, **_BERT_BLOCKS},
    # Absent parts (position embeddings in v3, token types, own position projections with
    # share_att_key) resolve to None and are left out.
    "deberta-v2": {**_BERT_EMBEDDINGS, "encoder.rel_embeddings": "rel_embeddings",
                   "encoder.LayerNorm": "rel_layer_norm",
                   **{f"encoder.layer.{{i}}.{k}": f"blocks.{{i}}.{v}"
                      for k, v in _DEBERTA_LAYER.items()}},
    "distilbert": {
        "embeddings.word_embeddings": "embeddings.word_embeddings",
        "embeddings.position_embeddings": "embeddings.position_embeddings",
        "embeddings.LayerNorm": "embeddings.layer_norm",
        "transformer.layer.{i}.attention.q_lin": "blocks.{i}.attention.query",
        "transformer.layer.{i}.attention.k_lin": "blocks.{i}.attention.key",
        "transformer.layer.{i}.attention.v_lin": "blocks.{i}.attention.value",
        "transformer.layer.{i}.attention.out_lin": "blocks.{i}.attention.output_dense",
        "transformer.layer.{i}.sa_layer_norm": "blocks.{i}.attention_layer_norm",
        "transformer.layer.{i}.ffn.lin1": "blocks.{i}.feed_forward.intermediate",
        "transformer.layer.{i}.ffn.lin2": "blocks.{i}.feed_forward.output_dense",
        "transformer.layer.{i}.output_layer_norm": "blocks.{i}.output_layer_norm",
    },
}
# PyTorch module -> head attribute path.
HEAD_TABLES = {
    heads.BertSequenceHead: {"classifier": "classifier"},
    heads.DistilBertSequenceHead: {"pre_classifier": "pre_classifier",
                                   "classifier": "classifier"},
    heads.ElectraSequenceHead: {"classifier.dense": "dense", "classifier.out_proj": "out_proj"},
    heads.RobertaSequenceHead: {"classifier.dense": "dense", "classifier.out_proj": "out_proj"},
    heads.DebertaSequenceHead: {"pooler.dense": "pooler", "classifier": "classifier"},
    heads.TokenHead: {"classifier": "classifier"},  # *ForTokenClassification of each family
}
# Encoder weights a checkpoint may lack; transformers initialises them afresh (a BERT saved
# without its pooler, as BertForMaskedLM and BertForTokenClassification save it). A model
# without a pooler (token classification) ignores a checkpoint's, as transformers does.
OPTIONAL = ("pooler.",)
# Buffers, not weights, that older checkpoints carry and transformers ignores.
BUFFERS = ("position_ids", "token_type_ids")
# Weights a family's checkpoints may carry that its model (so configured) does not use:
# transformers' _keys_to_ignore_on_load_unexpected (DeBERTa-v3 without absolute positions).
IGNORED = {"deberta-v2": ("embeddings.position_embeddings.weight",)}


def encoder_parameters(model) -> dict[str, tuple[tf.Variable, bool]]:
    """PyTorch key (without the family prefix) -> (variable, transposed) for the encoder."""
    table = ENCODER_TABLES[model.config.encoder_family]
    return _parameters(model.encoder, table, model.config.num_layers)


def head_parameters(model) -> dict[str, tuple[tf.Variable, bool]]:
    return _parameters(model.head, HEAD_TABLES[type(model.head)], 0)


def lacks_optional_weights(folder: Path | str, family: str, with_pooler: bool) -> bool:
    """Whether the encoder of `family` (built `with_pooler` or not) has optional weights
    (BERT's pooler) that `folder`/model.safetensors lacks, so that they start random.
    Reads the file's header only."""
    from safetensors import safe_open

    path = Path(folder) / SAFETENSORS
    if not with_pooler or not any(k.startswith(OPTIONAL) for k in ENCODER_TABLES[family]):
        return False
    if not path.is_file():
        return False  # load_hf_weights names the missing file
    prefix = PREFIXES.get(family, family) + "."
    with safe_open(str(path), "np") as f:
        return not any(key.removeprefix(prefix).startswith(OPTIONAL) for key in f.keys())


def load_hf_weights(model, folder: Path | str, *, keep_head: bool) -> list[str]:
    """Assign `folder`/model.safetensors to `model` (tasks.model.build_classifier's).

    The encoder must match: a missing, mismatched or unknown encoder weight raises
    BertflowError naming the file; nothing is assigned then. Keys with or without the
    family's prefix are read (a bare BertModel checkpoint has none). Other models' heads and
    pretraining heads (`cls.*`, `generator_*`, `discriminator_predictions.*`, ...) are
    ignored, as transformers ignores them. The head is loaded where `keep_head` and the
    checkpoint has it in the same shape. Returns the keys left at their initial values
    (normal(initializer_range) kernels, zero biases), as transformers initialises them.
    """
    from safetensors.numpy import load_file

    path = Path(folder) / SAFETENSORS
    if not path.is_file():
        raise BertflowError(f"{path}: not found (a checkpoint folder needs {SAFETENSORS})")
    state = {_modern_key(key): value for key, value in load_file(str(path)).items()}
    encoder_state, rest = _split_encoder(state, model.config.encoder_family)
    expected = encoder_parameters(model)

    missing = [k for k in expected if k not in encoder_state and not k.startswith(OPTIONAL)]
    mismatched = [f"{k} {encoder_state[k].shape} in the file, {_torch_shape(*expected[k])} "
                  f"by {CONFIG}"
                  for k in expected if k in encoder_state
                  and encoder_state[k].shape != _torch_shape(*expected[k])]
    unexpected = [k for k in encoder_state
                  if k not in expected and not k.endswith(BUFFERS) and not k.startswith(OPTIONAL)
                  and k not in IGNORED.get(model.config.family, ())]
    if missing or mismatched or unexpected:
        raise BertflowError(
            f"{path}: does not match its {CONFIG} ({model.config.family}, "
            f"{model.config.num_layers} layers, hidden size {model.config.hidden_size}): "
            + "; ".join(f"{what} {keys[:5]}{' ...' if len(keys) > 5 else ''}"
                        for what, keys in (("missing", missing), ("mismatched", mismatched),
                                           ("unexpected", unexpected)) if keys))

    fresh = [k for k in expected if k not in encoder_state]
    assignments = [(expected[k], encoder_state[k]) for k in expected if k in encoder_state]
    for key, (variable, transposed) in head_parameters(model).items():
        value = rest.get(key)
        if keep_head and value is not None and value.shape == _torch_shape(variable,
                                                                           transposed):
            assignments.append(((variable, transposed), value))
        else:
            fresh.append(key)
    for (variable, transposed), value in assignments:
        variable.assign(np.asarray(value.T if transposed else value, np.float32))
    return fresh


def save_hf_checkpoint(model, labels: list[str], folder: Path | str,
                       problem_type: str = "single_label_classification") -> None:
    """Write `folder`/model.safetensors (PyTorch's key layout with the family prefix,
    float32, metadata format=pt) and config.json: what transformers'
    AutoModelForSequenceClassification.from_pretrained (AutoModelForTokenClassification for
    a token classification model) loads with no missing or unexpected keys. `problem_type`
    (config.json's) tells transformers the sequence task's loss: single_label_classification,
    multi_label_classification or regression (one label)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    prefix = model.config.prefix + "."
    state = {prefix + key: _torch_tensor(*entry)
             for key, entry in encoder_parameters(model).items()}
    state.update({key: _torch_tensor(*entry) for key, entry in head_parameters(model).items()})
    # "format": "pt" is what PyTorch's from_pretrained asks of a safetensors file.
    safetensors_stream.save_file(state, folder / SAFETENSORS, metadata={"format": "pt"})
    config = model.config.to_hf_config(labels, problem_type, task=model.task)
    (folder / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _parameters(root, table: dict[str, str], num_layers: int):
    entries = {}
    for torch_module, path in table.items():
        pairs = ([(torch_module, path)] if "{i}" not in torch_module else
                 [(torch_module.format(i=i), path.format(i=i)) for i in range(num_layers)])
        for module, attribute in pairs:
            found = _resolve(root, attribute)
            if found is not None:  # e.g. no projection when ELECTRA's sizes agree
                entries.update({f"{module}.{name}": entry
                                for name, entry in _module_parameters(found).items()})
    return entries


def _resolve(root, path: str):
    for part in path.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
        if root is None:
            return None
    return root


def _module_parameters(found) -> dict[str, tuple[tf.Variable, bool]]:
    if isinstance(found, tf_keras.layers.Dense):
        return {"weight": (found.kernel, True), "bias": (found.bias, False)}
    if isinstance(found, tf_keras.layers.LayerNormalization):
        return {"weight": (found.gamma, False), "bias": (found.beta, False)}
    return {"weight": (found, False)}  # an embedding table


def _torch_shape(variable: tf.Variable, transposed: bool) -> tuple[int, ...]:
    shape = tuple(variable.shape)
    return shape[::-1] if transposed else shape


def _torch_tensor(variable: tf.Variable, transposed: bool) -> safetensors_stream.Tensor:
    """The variable in PyTorch's layout (Linear weights are [out, in]), float32, made when
    the writer reaches it."""
    def value() -> np.ndarray:  # the writer makes a transposed view contiguous
        value = variable.numpy().astype(np.float32, copy=False)
        return value.T if transposed else value
    return safetensors_stream.Tensor(_torch_shape(variable, transposed), np.float32, value)


def _modern_key(key: str) -> str:
    """Early checkpoints name LayerNorm parameters gamma and beta (transformers renames them
    so too)."""
    if key.endswith("LayerNorm.gamma"):
        return key[:-len("gamma")] + "weight"
    if key.endswith("LayerNorm.beta"):
        return key[:-len("beta")] + "bias"
    return key


def _split_encoder(state: dict, family: str) -> tuple[dict, dict]:
    """(encoder weights without the family prefix, the other keys)."""
    prefix = PREFIXES.get(family, family) + "."
    if any(key.startswith(prefix) for key in state):
        encoder = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        return encoder, {k: v for k, v in state.items() if not k.startswith(prefix)}
    # A bare encoder (the default MiniLM is a BertModel): its modules' top-level names.
    roots = {key.split(".")[0] for key in ENCODER_TABLES[family]}
    encoder = {k: v for k, v in state.items() if k.split(".")[0] in roots}
    return encoder, {k: v for k, v in state.items() if k not in encoder}
