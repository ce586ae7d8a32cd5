"""Base checkpoints: find them, check them, and load bertflow's classifier from them.

A checkpoint folder holds `config.json` (a BERT, DistilBERT, ELECTRA or RoBERTa config), its
family's tokenizer files (`vocab.txt`; RoBERTa's `vocab.json` and `merges.txt`) and
`model.safetensors` in PyTorch's key layout: what the Hugging Face hub and the offline default
ship, and what the train step writes (tasks/model/hf_weights.py).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from tasks.errors import BertflowError

SAFETENSORS = "model.safetensors"
VOCAB = "vocab.txt"


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
    """The folder has the files a checkpoint needs and a config of a supported family."""
    from tasks.model.config import EncoderConfig

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise BertflowError(f"{model_dir}: checkpoint folder not found (set base_model to a "
                            f"folder with config.json, vocab.txt (RoBERTa: vocab.json and "
                            f"merges.txt) and model.safetensors)")
    missing = [name for name in ("config.json", SAFETENSORS)
               if not (model_dir / name).is_file()]
    if missing:
        hint = (" (a TensorFlow-only tf_model.h5 checkpoint: save it with PyTorch's "
                "save_pretrained, which writes model.safetensors)"
                if (model_dir / "tf_model.h5").is_file() else "")
        raise BertflowError(f"{model_dir}: checkpoint folder is missing "
                            f"{', '.join(missing)}{hint}")
    EncoderConfig.from_pretrained(model_dir)  # an unsupported family is refused here
    tokenizer_files(model_dir)


def casing(model_dir: Path, cfg):
    """The run's tokenizer casing (tasks/model/casing.py): the checkpoint's, or lower_case
    where set and not contradicting it (or lower_case_override)."""
    from tasks.model import casing as casing_lib
    from tasks.model.config import EncoderConfig

    found = casing_lib.read(model_dir, EncoderConfig.from_pretrained(model_dir).family)
    return casing_lib.decide(cfg.lower_case, cfg.lower_case_override, found)


def run_casing(cfg):
    """The run's casing where the weights are not loaded (the data step's leakage key): the
    checkpoint's small files read again as validate read them, which gives its accents too
    (validate pins only lower_case). Where they cannot be read here (a path in a remote
    worker's image), lower_case as validate pinned it, accents following it."""
    from tasks.model import casing as casing_lib
    from tasks.training import checkpoint_sources

    found = checkpoint_sources.casing(cfg)
    if found is not None:
        return casing_lib.decide(cfg.lower_case, cfg.lower_case_override, found)
    if cfg.lower_case is not None:
        return casing_lib.Casing(cfg.lower_case, "lower_case as validate pinned it", False)
    return casing(resolve_base_model(cfg), cfg)


def vocab_path(model_dir: Path) -> Path:
    """vocab.txt of a WordPiece checkpoint (BERT, DistilBERT, ELECTRA)."""
    path = Path(model_dir) / VOCAB
    if not path.is_file():
        raise BertflowError(f"{model_dir}: checkpoint folder is missing {VOCAB}")
    return path


def tokenizer_files(model_dir: Path) -> list[Path]:
    """The checkpoint's tokenizer files for its family: what its text encoder reads, what
    the tokenize cache key hashes and what the train step copies beside the weights."""
    from tasks.model.config import TOKENIZER_FILES, EncoderConfig

    family = EncoderConfig.from_pretrained(model_dir).family
    names = TOKENIZER_FILES[family]
    missing = [name for name in names if not (Path(model_dir) / name).is_file()]
    if missing:
        raise BertflowError(f"{model_dir}: checkpoint folder is missing {', '.join(missing)} "
                            f"(a {family} checkpoint's tokenizer is {' and '.join(names)})")
    return [Path(model_dir) / name for name in names]


def text_encoder(model_dir: Path, lower_case: bool, max_seq_length: int,
                 strip_accents: bool | None = None):
    """The family's in-graph tokenizer (tasks/model): WordPiece's BertTextEncoder, RoBERTa's
    byte-level BPE, or XLM-R's or DeBERTa-v3's SentencePiece model; all but WordPiece read text
    as it is (no lower-casing, no accent stripping). strip_accents: None follows lower_case
    (`casing.Casing.strip_accents`)."""
    import importlib

    from tasks.model.config import EncoderConfig
    from tasks.model.families import FAMILIES

    files = tokenizer_files(model_dir)
    family = EncoderConfig.from_pretrained(model_dir).family
    if FAMILIES[family].text_encoder is None:
        from tasks.model.text_encoder import BertTextEncoder

        return BertTextEncoder(files[0], lower_case, max_seq_length, strip_accents)
    # Every other family's tokenizer reads text as it is.
    module, name, tokenizer = FAMILIES[family].text_encoder
    if lower_case or strip_accents:
        raise BertflowError(f"{model_dir}: a {family} checkpoint's {tokenizer} does not "
                            "lower-case or strip accents; leave lower_case empty or false")
    return getattr(importlib.import_module(module), name)(*files, max_seq_length=max_seq_length)


def copy_tokenizer_files(model_dir: Path, out: Path) -> None:
    for path in tokenizer_files(model_dir):
        shutil.copy(path, Path(out) / path.name)


def load_classifier(model_dir: Path, labels: list[str], *, cpu_kernels: bool = False,
                    gelu: str | None = None, head: str = "sequence_classification"):
    """bertflow's classifier (tasks/model) with one output per label, encoder weights from
    `model_dir`. Call inside `strategy.scope()` so the variables are distributed.

    The encoder always comes from `model_dir`. A classification head in `model_dir` of the
    right size is kept unless its config.json names other labels (or another order) than
    `labels`; then the head starts fresh (`describe_head` says which). `cpu_kernels` runs
    dropout, LayerNorm and GELU on bertflow's CPU kernels: only for training and evaluation
    on CPU, never for a model that is exported. `gelu` as tasks.model.build_classifier takes
    it (default: the kernel's with cpu_kernels, else computed in float32). `head`: the
    task's head (tasks/task_kinds.py TaskKind.head); a checkpoint whose architecture has
    another task's head (a sequence classifier when tagging tokens) gives only its encoder.
    """
    from tasks.model.classifier import load_classifier as build_and_load

    model_dir = Path(model_dir)
    check_model_dir(model_dir)
    # Named labels that differ: the head would map outputs to the wrong classes.
    found = head_labels(model_dir)
    keep_head = (found is None or found == list(labels)) and head_task(model_dir) in (
        None, head)
    return build_and_load(model_dir, len(labels), keep_head=keep_head, gelu=gelu,
                          cpu_kernels=cpu_kernels, task=head)


def head_task(model_dir: Path) -> str | None:
    """The task of the head `model_dir`'s config.json names by its architecture
    (BertForTokenClassification: "token_classification"), None for a bare encoder."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    for name in config.get("architectures") or ():
        if name.endswith("ForTokenClassification"):
            return "token_classification"
        if name.endswith("ForSequenceClassification"):
            return "sequence_classification"
    return None


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
