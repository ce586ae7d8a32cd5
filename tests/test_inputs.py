"""TFRecords -> batches: padding, masks, bucketing, exact evaluation order and sharding."""
import numpy as np
import pytest
import tensorflow as tf

from tasks.training import inputs
from train_helpers import tiny_rows, write_tfrecords

ROWS = tiny_rows(37, seed=3, min_len=2, max_len=40)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    paths = [root / f"part-{k}.tfrecord" for k in range(3)]
    for k, path in enumerate(paths):
        write_tfrecords(path, ROWS[k::3])
    return [str(p) for p in paths]


def rows_of(batches):
    """(ids without padding, label) per row, checking masks and padding on the way."""
    out = []
    for features, labels in batches:
        ids, mask = features["input_ids"].numpy(), features["attention_mask"].numpy()
        assert features["input_ids"].dtype == tf.int32 and labels.dtype == tf.int32
        assert features["token_type_ids"].shape == ids.shape == mask.shape
        for row_ids, row_mask, label in zip(ids, mask, labels.numpy()):
            length = int(row_mask.sum())
            assert (row_mask[:length] == 1).all() and (row_ids[length:] == 0).all()
            out.append((tuple(row_ids[:length]), int(label)))
    return out


def expected_rows(files_order=(0, 1, 2)):
    return [(tuple(ids), label) for k in files_order for ids, _, label in ROWS[k::3]]


def test_bucket_boundaries():
    assert inputs.bucket_boundaries(128) == [17, 33, 65, 129]
    assert inputs.bucket_boundaries(16) == [17]


def test_eval_keeps_every_row_once_sorted_by_length_with_a_partial_last_batch(shards):
    batches = list(inputs.eval_dataset(shards, 8))
    assert [len(labels) for _, labels in batches] == [8, 8, 8, 8, 5]
    assert sorted(rows_of(batches)) == sorted(expected_rows())
    lengths = [f["attention_mask"].numpy().sum(axis=1) for f, _ in batches]
    # 37 rows are one window: longest first (ties in file order), each batch padded to its
    # own longest row.
    assert [len(ids) for ids, _ in rows_of(batches)] == \
        sorted((len(ids) for ids, _ in expected_rows()), reverse=True)
    assert rows_of(batches)[:3] == sorted(expected_rows(), key=lambda r: -len(r[0]))[:3]
    for (features, _), row_lengths in zip(batches, lengths):
        assert features["input_ids"].shape[1] == row_lengths.max()
    real = sum(int(x.sum()) for x in lengths)
    padded = sum(f["input_ids"].shape[0] * f["input_ids"].shape[1] for f, _ in batches)
    assert real / padded > 0.85  # rows 2-41 tokens long; in file order 36% is padding


def test_eval_windows_keep_file_order_between_them(shards, monkeypatch):
    monkeypatch.setattr(inputs, "WINDOW_BATCHES", 2)  # windows of 16 rows
    batches = list(inputs.eval_dataset(shards, 8))
    rows, expected = rows_of(batches), expected_rows()
    assert [len(labels) for _, labels in batches] == [8, 8, 8, 8, 5]
    for start in (0, 16, 32):
        assert sorted(rows[start:start + 16]) == sorted(expected[start:start + 16])


def test_train_batches_are_full_length_grouped_and_cover_the_data(shards):
    batches = list(inputs.train_dataset(shards, 4, max_seq_length=64, seed=1,
                                        num_rows=len(ROWS)).take(60))
    assert all(len(labels) == 4 for _, labels in batches)
    for features, _ in batches:
        lengths = features["attention_mask"].numpy().sum(axis=1)
        assert features["input_ids"].shape[1] == lengths.max()  # padded to its longest row
    assert set(rows_of(batches)) == set(expected_rows())  # 240 rows cover all 37

    # 37 rows cap the sorting window at 9 batches of 4: the first window holds 36 different
    # rows, sorted by length into batches whose lengths do not overlap, in shuffled order.
    window = batches[:9]
    assert len(set(rows_of(window))) == 36
    spans = [(int(m.sum(1).min()), int(m.sum(1).max()))
             for m in (f["attention_mask"].numpy() for f, _ in window)]
    ordered = sorted(spans, reverse=True)
    assert all(shorter[1] <= longer[0] for longer, shorter in zip(ordered, ordered[1:]))
    assert spans != ordered
    real = sum(int(f["attention_mask"].numpy().sum()) for f, _ in window)
    padded = sum(f["input_ids"].shape[1] * 4 for f, _ in window)
    assert real / padded > 0.9  # rows 2-41 tokens long, under 10% padding


def test_without_grouping_batches_are_the_shuffled_stream_in_order(shards):
    grouped = list(inputs.train_dataset(shards, 4, 64, seed=1, num_rows=len(ROWS)).take(9))
    plain = list(inputs.train_dataset(shards, 4, 64, seed=1, num_rows=len(ROWS),
                                      group_by_length=False).take(9))
    # The same 36 shuffled rows: grouped, sorted across the window; plain, batches of 4 in
    # the stream's order, so their length spans overlap and padding is far higher.
    assert sorted(rows_of(plain)) == sorted(rows_of(grouped))
    spans = sorted(((int(m.sum(1).min()), int(m.sum(1).max()))
                    for m in (f["attention_mask"].numpy() for f, _ in plain)), reverse=True)
    assert any(shorter[1] > longer[0] for longer, shorter in zip(spans, spans[1:]))

    def real_share(batches):
        real = sum(int(f["attention_mask"].numpy().sum()) for f, _ in batches)
        return real / sum(f["input_ids"].shape[1] * 4 for f, _ in batches)

    assert real_share(plain) < real_share(grouped) - 0.1


def test_train_order_is_seeded(shards):
    def first_rows(seed):
        return rows_of(inputs.train_dataset(shards, 4, 64, seed=seed).take(5))

    assert first_rows(7) == first_rows(7)
    assert first_rows(7) != first_rows(8)


def test_static_shapes_for_tpu(shards):
    train = list(inputs.train_dataset(shards, 4, 64, seed=1, static_shapes=True).take(20))
    assert {f["input_ids"].shape[1] for f, _ in train} <= {16, 32, 64}
    ds = inputs.eval_dataset(shards, 8, static_shapes=True, max_seq_length=64)
    assert ds.element_spec[0]["input_ids"].shape == (8, 64)
    labels = np.concatenate([labels.numpy() for _, labels in ds])
    assert len(labels) == 40 and (labels[37:] == inputs.PAD_LABEL).all()
    assert (labels[:37] != inputs.PAD_LABEL).all()


def test_static_shapes_give_every_replica_as_many_full_batches(shards):
    """37 rows, 2 replicas of one pipeline, 8 rows each: 5 batches would leave the second
    replica one short (tf.distribute would hand it a dummy batch, which a static program
    cannot take); filler rows make it 6, the real rows first, in order."""
    ctx = tf.distribute.InputContext(1, 0, num_replicas_in_sync=2)
    ds = inputs.eval_dataset(shards, 16, ctx, static_shapes=True, max_seq_length=64)
    assert ds.element_spec[0]["input_ids"].shape == (8, 64)
    batches = [labels.numpy() for _, labels in ds]
    assert len(batches) == 6
    labels = np.concatenate(batches)
    assert (labels[:37] != inputs.PAD_LABEL).all() and (labels[37:] == inputs.PAD_LABEL).all()


@pytest.mark.parametrize("pipelines", [2, 5])  # by file (3 files >= 2) and by row (3 < 5)
def test_input_pipelines_split_the_rows_exactly(shards, pipelines):
    seen = []
    for index in range(pipelines):
        ctx = tf.distribute.InputContext(pipelines, index, num_replicas_in_sync=pipelines)
        seen += rows_of(inputs.eval_dataset(shards, 2 * pipelines, ctx))
    assert sorted(seen) == sorted(expected_rows())


def test_no_shards_is_an_error():
    with pytest.raises(Exception, match="no TFRecord shards"):
        inputs.eval_dataset([], 8)


@pytest.mark.parametrize("task, spec", [
    ("multi_label", {"dtype": "float32", "shape": [2]}),
    ("regression", {"dtype": "float32", "shape": [1]})])
def test_float_labels_batch_and_pad_for_tpu(tmp_path, task, spec):
    """Multi-hot vectors and scores as the tokenize manifest's label_spec says; TPU filler
    rows carry NaN (where -1 could be a score), which is_real tells from real rows."""
    rows = tiny_rows(13, seed=4, task=task)
    path = tmp_path / "float.tfrecord"
    write_tfrecords(path, rows)
    batches = list(inputs.eval_dataset([str(path)], 4, label_spec=spec))
    labels = np.concatenate([b[1].numpy() for b in batches])
    assert labels.dtype == np.float32 and labels.shape == (13, spec["shape"][0])
    assert sorted(map(tuple, labels)) == sorted(tuple(r[2]) for r in rows)
    padded = inputs.eval_dataset([str(path)], 4, static_shapes=True, max_seq_length=32,
                                 label_spec=spec)
    real = np.concatenate([inputs.is_real(b[1]).numpy() for b in padded])
    assert len(real) == 16 and real.sum() == 13 and not real[13:].any()
    train = next(iter(inputs.train_dataset([str(path)], 4, 32, seed=1, label_spec=spec)))
    assert train[1].shape == (4, spec["shape"][0])


TOKEN_SPEC = {"dtype": "int64", "shape": [None], "per_token": True}


@pytest.mark.parametrize("static_shapes", [False, True])
def test_token_labels_follow_their_pieces_padded_with_ignored(tmp_path, static_shapes):
    """Per-piece tag ids are cut and padded with the batch's input ids (IGNORED, -100, on
    padding); TPU batches pad both to the bucket or max_seq_length, and filler rows carry
    PAD_LABEL where a sentence has IGNORED for [CLS], which is_real tells apart."""
    rows = tiny_rows(13, seed=4, task="token_classification")
    path = tmp_path / "tokens.tfrecord"
    write_tfrecords(path, rows)
    batches = list(inputs.train_dataset([str(path)], 4, 32, seed=1, label_spec=TOKEN_SPEC,
                                        static_shapes=static_shapes).take(6))
    for features, labels in batches:
        assert labels.shape == features["input_ids"].shape
        mask = features["attention_mask"].numpy() == 1
        assert (labels.numpy()[~mask] == -100).all() and (labels.numpy()[:, 0] == -100).all()
    if static_shapes:
        assert {f["input_ids"].shape[1] for f, _ in batches} <= {16, 32}
    evals = list(inputs.eval_dataset([str(path)], 4, static_shapes=static_shapes,
                                     max_seq_length=32, label_spec=TOKEN_SPEC))
    real = np.concatenate([inputs.is_real(labels).numpy() for _, labels in evals])
    assert real.sum() == 13 and len(real) == (16 if static_shapes else 13)
    got = sorted(tuple(x for x in row if x != -100) for _, labels in evals
                 for row, keep in zip(labels.numpy(), inputs.is_real(labels).numpy()) if keep)
    assert got == sorted(tuple(x for x in r[2] if x != -100) for r in rows)


def test_training_input_has_no_autotune_model_down_to_the_device_datasets(shards):
    """An iterator with a tf.data autotuning model made the train step wait up to a minute
    when fit dropped it (tasks/training/inputs.py, WITHOUT_AUTOTUNE_MODEL): neither the
    training input nor the dataset a strategy's iterator feeds each device through has one."""
    from tasks.steps import train

    assert inputs.train_dataset(shards, 4, 64, seed=1).options().autotune.enabled is False
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    data = train.distribute(strategy, "one_device", lambda context, skip_batches=0:
                            inputs.train_dataset(shards, 4, 64, seed=1, input_context=context),
                            start_step=0)
    iterator = iter(data)
    (worker,) = iterator._iterators  # noqa: SLF001  (no public handle on these)
    device_datasets = [it._dataset for it in worker._iterator._device_iterators]  # noqa: SLF001
    assert device_datasets and all(d.options().autotune.enabled is False
                                   for d in device_datasets)
    features, _ = next(iterator)
    assert features["input_ids"].shape[0] == 4
