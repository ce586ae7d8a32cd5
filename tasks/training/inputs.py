"""Tokenized TFRecords -> padded batches for training and evaluation.

Rows are stored unpadded (see the tokenize manifest); batches are padded to their longest row
(rows of similar length together, so little compute goes to padding), or to fixed bucket sizes
with `static_shapes` for TPUs, which compile one program per shape.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import tensorflow as tf

from tasks.io import storage
from tasks.errors import BertflowError
from tasks.task_kinds import IGNORED

AUTOTUNE = tf.data.AUTOTUNE
SHUFFLE_BUFFER = 10_000
PAD_LABEL = -1  # filler rows added for static shapes; metrics ignore them (is_real)
# The tokenize manifest's `label_spec` of classification, and of manifests written before
# other tasks existed.
CLASS_LABEL = {"dtype": "int64", "shape": []}


def per_token(label_spec: dict | None) -> bool:
    """Labels per word piece (token classification): padded with IGNORED, cut with the
    batch's width."""
    return bool((label_spec or {}).get("per_token"))


def windowed(label_spec: dict | None) -> bool:
    """Records are windows of long texts, each with its text's `text_id` (long_text window:
    evaluation aggregates a text's windows)."""
    return bool((label_spec or {}).get("text_id"))


def _feature_spec(label_spec: dict | None, text_ids: bool = False) -> dict:
    label_spec = label_spec or CLASS_LABEL
    label = (tf.io.VarLenFeature(tf.int64) if per_token(label_spec)
             else tf.io.FixedLenFeature(label_spec["shape"], label_spec["dtype"]))
    spec = {"input_ids": tf.io.VarLenFeature(tf.int64),
            "token_type_ids": tf.io.VarLenFeature(tf.int64), "label": label}
    if text_ids:
        spec["text_id"] = tf.io.FixedLenFeature(text_id_shape(label_spec), tf.int64)
    return spec


def text_id_shape(label_spec: dict | None) -> list[int]:
    """A window's `text_id`: its text's index, or [text, window] (token classification)."""
    return [2] if (label_spec or {}).get("window_index") else []


def pad_label(label_spec: dict | None) -> tf.Tensor:
    """The label of filler rows: PAD_LABEL for class indices (and as the first piece's
    label, where a real row has IGNORED for [CLS], for per-token labels); NaN for float
    labels, where -1 could be a real score."""
    label_spec = label_spec or CLASS_LABEL
    if per_token(label_spec):
        return tf.constant([PAD_LABEL])
    if label_spec["dtype"] == "int64":
        return tf.constant(PAD_LABEL)
    return tf.fill(label_spec["shape"], float("nan"))


def padding_values(label_spec: dict | None, text_ids: bool = False):
    """padded_batch's padding for (features, label): zeros, and IGNORED for per-token labels
    (None: zeros everywhere)."""
    if not per_token(label_spec):
        return None
    features = {"input_ids": 0, "token_type_ids": 0, "attention_mask": 0}
    if text_ids:  # evaluation's windows: a fixed shape, never padded
        features["text_id"] = tf.constant(0, tf.int64)
    return features, tf.constant(IGNORED, tf.int32)


def is_real(labels: tf.Tensor) -> tf.Tensor:
    """[batch] bool: the rows that are not filler (see pad_label)."""
    if labels.dtype.is_integer and labels.shape.rank == 2:  # per-token: look at [CLS]'s
        return labels[:, 0] != PAD_LABEL
    if labels.dtype.is_integer:
        return labels != PAD_LABEL
    return tf.logical_not(tf.math.is_nan(tf.reshape(labels, [tf.shape(labels)[0], -1])[:, 0]))


@contextmanager
def local_shards(tokenize_manifest: dict, split: str) -> Iterator[list[str]]:
    """Local paths of a split's shards; remote caches are downloaded for the duration."""
    shards = tokenize_manifest["splits"][split]["shards"]
    if all(storage.is_local(uri) for uri in shards):
        yield [str(storage.local_path(uri)) for uri in shards]
        return
    cache = tokenize_manifest["cache_uri"].rstrip("/") + "/"
    outside = [uri for uri in shards if not uri.startswith(cache)]
    if outside:
        raise BertflowError(f"{outside[0]}: shard is not under the cache folder {cache}")
    with storage.staged_local_dir(cache, "r") as local:
        yield [str(local / uri[len(cache):]) for uri in shards]


# tf.data runs AutoGraph on every function it maps: this module's branch on Python values
# (the label spec, dtypes, static ranks), never on a tensor, so converting their sources was
# pure cost, ~1 s of CPU in each train and evaluate process (by hand, no results file).
_plain = tf.autograph.experimental.do_not_convert


@_plain
def parse_example(serialized: tf.Tensor, label_spec: dict | None = None,
                  text_ids: bool = False) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """One record -> (features, label): an int32 class index, or float32 labels of
    `label_spec`'s shape (the tokenize manifest's). `text_ids`: features also hold the
    window's int64 `text_id` (evaluation of windowed records; the model never sees it)."""
    row = tf.io.parse_single_example(serialized, _feature_spec(label_spec, text_ids))
    input_ids = tf.cast(tf.sparse.to_dense(row["input_ids"]), tf.int32)
    features = {
        "input_ids": input_ids,
        "token_type_ids": tf.cast(tf.sparse.to_dense(row["token_type_ids"]), tf.int32),
        # Padding adds zeros, so ones over the real tokens become the mask of every batch.
        "attention_mask": tf.ones_like(input_ids),
    }
    if text_ids:
        features["text_id"] = row["text_id"]
    label = row["label"]
    if isinstance(label, tf.SparseTensor):  # per-token labels: one per input id
        label = tf.sparse.to_dense(label)
    return features, (tf.cast(label, tf.int32) if label.dtype == tf.int64 else label)


def bucket_boundaries(max_seq_length: int) -> list[int]:
    """Upper bounds (exclusive) of the static-shape buckets: 16, 32, 64, ... up to
    max_seq_length."""
    bounds, size = [], 16
    while size < max_seq_length:
        bounds.append(size + 1)
        size *= 2
    return bounds + [max_seq_length + 1]


def train_dataset(files: list[str], global_batch_size: int, max_seq_length: int, seed: int,
                  input_context: tf.distribute.InputContext | None = None,
                  static_shapes: bool = False, skip_batches: int = 0,
                  num_rows: int | None = None,
                  label_spec: dict | None = None,
                  group_by_length: bool = True) -> tf.data.Dataset:
    """Endless, shuffled batches of `global_batch_size` split per replica, with rows of
    similar length together (the caller sets steps per epoch). The order depends only on
    `seed` and the pipeline's share of the files; `skip_batches` starts it that many batches in
    (to resume). `num_rows` (all pipelines together) caps the sorting window at one pass over
    this pipeline's rows, so that a small data set does not put copies of a row in one batch.

    Rows are grouped as Hugging Face's length-grouped sampler does: a window of shuffled rows
    is sorted by length, cut into batches each padded to its longest row, and the batches are
    shuffled. Every row of the stream is used in its window; padding on SST-2 is in
    benchmarks/results/train_throughput*.json (`summary.*.padding_fraction`), far below
    power-of-two length buckets'. With static shapes
    (TPU) batches come from length buckets padded to 16, 32, 64, ... so that only a few
    programs are compiled. `group_by_length` False: each batch is `batch` shuffled rows padded
    to its longest (a window of one batch).
    """
    batch = _per_replica(global_batch_size, input_context)
    ds = _records(files, input_context, shuffle_seed=seed, label_spec=label_spec)
    ds = ds.shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True).repeat()
    if static_shapes:
        bounds = bucket_boundaries(max_seq_length)
        ds = ds.bucket_by_sequence_length(
            lambda features, label: tf.shape(features["input_ids"])[0],
            bucket_boundaries=bounds, bucket_batch_sizes=[batch] * (len(bounds) + 1),
            padding_values=padding_values(label_spec),
            pad_to_bucket_boundary=True, drop_remainder=True)
    else:
        pipelines = input_context.num_input_pipelines if input_context else 1
        rows = (num_rows // pipelines) if num_rows else WINDOW_BATCHES * batch
        window = max(1, min(WINDOW_BATCHES, rows // batch)) if group_by_length else 1
        ds = _length_grouped(ds, batch, window, seed, label_spec)
    if skip_batches:
        ds = ds.skip(skip_batches)
    return ds.prefetch(AUTOTUNE).with_options(WITHOUT_AUTOTUNE_MODEL)


def _without_autotune_model() -> tf.data.Options:
    """Options with no tf.data autotuning model. Each iterator of a dataset with one runs an
    optimization thread that sleeps between rounds, longer and longer (up to a minute late
    in a run), and destroying the iterator waits for that thread: when fit returned, the
    train step could sit in RootDataset::Iterator's destructor for most of a minute (py-spy,
    by hand, no results file: after BANKING77's 3 epochs in half the runs). The training input
    is a few element-wise ops per
    batch: AUTOTUNE values then take tf.data's fixed defaults."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


WITHOUT_AUTOTUNE_MODEL = _without_autotune_model()


def _device_datasets_without_autotune_model() -> None:
    """The strategies' iterators (OneDevice, Mirrored, MultiWorkerMirrored) feed each device
    through a dataset of their own, made by multi_device_iterator_ops._create_device_dataset
    with default options, so with an autotuning model: the wait above. No public option
    reaches that dataset; this wraps the function to give it WITHOUT_AUTOTUNE_MODEL
    (tests/test_inputs.py checks that it still applies)."""
    from tensorflow.python.data.ops import multi_device_iterator_ops as device_iterators

    create = device_iterators._create_device_dataset  # noqa: SLF001
    if getattr(create, "without_autotune_model", False):
        return

    def create_without_model(*args, **kwargs):
        return create(*args, **kwargs).with_options(WITHOUT_AUTOTUNE_MODEL)

    create_without_model.without_autotune_model = True
    device_iterators._create_device_dataset = create_without_model  # noqa: SLF001


_device_datasets_without_autotune_model()

# Batches per sorting window, as in transformers' LengthGroupedSampler (its "megabatch").
WINDOW_BATCHES = 50


def _length_grouped(rows: tf.data.Dataset, batch: int, window_batches: int,
                    seed: int, label_spec: dict | None = None) -> tf.data.Dataset:
    windows = rows.padded_batch(batch * window_batches, drop_remainder=True,
                                padding_values=padding_values(label_spec)).enumerate()
    cut_labels = per_token(label_spec)

    @_plain
    def split(index, window):
        features, labels = window
        lengths = tf.reduce_sum(features["attention_mask"], axis=1)
        order = tf.argsort(lengths, direction="DESCENDING", stable=True)
        batch_order = tf.argsort(tf.random.stateless_uniform(
            [window_batches], seed=tf.stack([tf.cast(seed, tf.int64), index])))

        def cut(x):  # [window, ...] sorted -> [window_batches, batch, ...] shuffled
            x = tf.reshape(tf.gather(x, order),
                           tf.concat([[window_batches, batch], tf.shape(x)[1:]], 0))
            return tf.gather(x, batch_order)

        widths = tf.reduce_max(cut(lengths), axis=1)
        return tf.data.Dataset.from_tensor_slices(
            (tf.nest.map_structure(cut, features), cut(labels), widths))

    @_plain
    def trim(features, labels, width):
        return ({name: x[:, :width] for name, x in features.items()},
                labels[:, :width] if cut_labels else labels)

    return windows.flat_map(split).map(trim, num_parallel_calls=AUTOTUNE, deterministic=True)


def _length_sorted(rows: tf.data.Dataset, batch: int, window_batches: int,
                   label_spec: dict | None = None) -> tf.data.Dataset:
    """Windows of rows sorted by length (longest first), cut into batches each padded to its
    longest row; partial windows and batches are kept."""
    @_plain
    def split(features, labels):
        lengths = tf.reduce_sum(features["attention_mask"], axis=1)
        order = tf.argsort(lengths, direction="DESCENDING", stable=True)
        return tf.data.Dataset.from_tensor_slices(
            (tf.nest.map_structure(lambda x: tf.gather(x, order), features),
             tf.gather(labels, order))).batch(batch)

    cut_labels = per_token(label_spec)

    @_plain
    def trim(features, labels):
        width = tf.reduce_max(tf.reduce_sum(features["attention_mask"], axis=1))
        return ({name: x if name == "text_id" else x[:, :width]  # text_id: one per row
                 for name, x in features.items()},
                labels[:, :width] if cut_labels else labels)

    windows = rows.padded_batch(batch * window_batches,
                                padding_values=padding_values(label_spec, windowed(label_spec)))
    return windows.flat_map(split).map(trim, num_parallel_calls=AUTOTUNE, deterministic=True)


def eval_dataset(files: list[str], global_batch_size: int,
                 input_context: tf.distribute.InputContext | None = None,
                 static_shapes: bool = False, max_seq_length: int = 0,
                 label_spec: dict | None = None) -> tf.data.Dataset:
    """Every example exactly once, keeping the partial last batch.

    Rows are sorted by length within windows of WINDOW_BATCHES batches, in file order, and
    each batch is padded to its longest row: on SST-2's held-out rows, batches in file order
    were mostly padding (metrics do not depend on the order). With `static_shapes`, rows stay
    in file order, padded to max_seq_length, and filler rows labelled PAD_LABEL complete the
    last batch of every replica, so every batch has the same shape and every replica the same
    number of batches.
    """
    batch = _per_replica(global_batch_size, input_context)
    text_ids = windowed(label_spec)
    ds = _records(files, input_context, label_spec=label_spec, text_ids=text_ids)
    if not static_shapes:
        return _length_sorted(ds, batch, WINDOW_BATCHES, label_spec).prefetch(AUTOTUNE)
    filler = ({"input_ids": tf.zeros([1], tf.int32), "token_type_ids": tf.zeros([1], tf.int32),
               "attention_mask": tf.zeros([1], tf.int32)}, pad_label(label_spec))
    if text_ids:
        filler[0]["text_id"] = tf.fill(text_id_shape(label_spec), tf.constant(-1, tf.int64))
    # Every replica of this pipeline gets the same number of full batches: a replica left
    # without one would get tf.distribute's dummy batch, whose shapes a static-shape (TPU)
    # program does not take. Rows are grouped by `replicas` batches, the last group
    # completed with filler rows, then cut into per-replica batches.
    replicas = (input_context.num_replicas_in_sync // input_context.num_input_pipelines
                if input_context else 1)
    group = batch * replicas
    ds = ds.concatenate(tf.data.Dataset.from_tensors(filler).repeat(group - 1))
    shapes = ({name: text_id_shape(label_spec) if name == "text_id" else [max_seq_length]
               for name in filler[0]},
              [max_seq_length] if per_token(label_spec) else filler[1].shape)
    ds = ds.padded_batch(group, padded_shapes=shapes, drop_remainder=True,
                         padding_values=padding_values(label_spec, text_ids))
    if replicas > 1:
        ds = ds.unbatch().batch(batch, drop_remainder=True)
    return ds.prefetch(AUTOTUNE)


def _per_replica(global_batch_size: int, ctx: tf.distribute.InputContext | None) -> int:
    return ctx.get_per_replica_batch_size(global_batch_size) if ctx else global_batch_size


def _records(files: list[str], ctx: tf.distribute.InputContext | None,
             shuffle_seed: int | None = None, label_spec: dict | None = None,
             text_ids: bool = False) -> tf.data.Dataset:
    """Parsed rows of this input pipeline's share: whole files when there are enough to go
    round, else every n-th row (both give each row to exactly one pipeline)."""
    if not files:
        raise BertflowError("no TFRecord shards to read (the tokenize manifest lists none)")
    pipelines = ctx.num_input_pipelines if ctx else 1
    index = ctx.input_pipeline_id if ctx else 0
    names = tf.data.Dataset.from_tensor_slices(sorted(files))
    by_file = len(files) >= pipelines
    if by_file and pipelines > 1:
        names = names.shard(pipelines, index)
    if shuffle_seed is None:
        ds = names.flat_map(tf.data.TFRecordDataset)
    else:
        # deterministic=True (tf.data's default, pinned): parallel reads and parses keep
        # the input order, which exact resume and the `deterministic` Param rely on.
        ds = names.shuffle(len(files), seed=shuffle_seed).interleave(
            tf.data.TFRecordDataset, cycle_length=min(len(files), 4), num_parallel_calls=AUTOTUNE,
            deterministic=True)
    if not by_file:
        ds = ds.shard(pipelines, index)
    return ds.map(_plain(lambda record: parse_example(record, label_spec, text_ids)),
                  num_parallel_calls=AUTOTUNE, deterministic=True)
