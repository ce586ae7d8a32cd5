"""tasks.steps.tokenize: encoder parity with Hugging Face, TFRecord output, determinism, cache."""
import json
import time

import numpy as np
import pytest
import tensorflow as tf
import transformers

from tasks import fresh_load
from tasks.model import text_encoder
from tasks.training import checkpoint
from tasks.steps import data, prepared, tokenize
from tasks.io import storage, tfrecord_io
from tasks.config import DEMO_DIR, PROJECT_ROOT, parse_config
from tasks.runs.runlayout import RunContext

SST2 = PROJECT_ROOT.parent / "shared" / "data" / "sst2" / "train.tsv"


@pytest.fixture(scope="module")
def vocab_file():
    return checkpoint.vocab_path(checkpoint.resolve_base_model(parse_config({})))


@pytest.fixture(scope="module")
def encoder(vocab_file):
    return text_encoder.BertTextEncoder(vocab_file, lower_case=True, max_seq_length=128)


@pytest.fixture(scope="module")
def hf_tokenizer(vocab_file):
    return transformers.BertTokenizer(vocab=str(vocab_file), do_lower_case=True)


# --- encoder -----------------------------------------------------------------------------
def test_parity_with_hugging_face_on_all_of_sst2(encoder, hf_tokenizer):
    if not SST2.is_file():
        pytest.skip(f"{SST2} not present (shared datasets are not checked in)")
    lines = SST2.read_text(encoding="utf-8").splitlines()[1:]
    texts = [line.rsplit("\t", 1)[0].strip() for line in lines]
    ids, types = encoder(tf.constant(texts))
    expected = hf_tokenizer(texts, truncation=True, max_length=128)
    ours = ids.to_list()
    mismatches = [i for i, (a, b) in enumerate(zip(ours, expected["input_ids"])) if a != b]
    assert len(ours) == 67349 and not mismatches, f"{len(mismatches)} rows differ, first " \
                                                 f"{texts[mismatches[0]]!r}"
    assert np.all(types.flat_values.numpy() == 0)


def test_pair_truncation_matches_hugging_face_longest_first(vocab_file, hf_tokenizer):
    words = "the quick brown fox jumps over a lazy dog again and again".split()
    texts, pairs = [], []
    for n_a in range(0, 12):
        for n_b in range(0, 12):  # covers ties, odd budgets, one or both segments cut
            texts.append(" ".join(words[:n_a]) or "x")
            pairs.append(" ".join(reversed(words[:n_b])) or "y")
    for max_len in (8, 11, 16):
        enc = text_encoder.BertTextEncoder(vocab_file, True, max_len)
        ids, types = enc(tf.constant(texts), tf.constant(pairs))
        expected = hf_tokenizer(texts, pairs, truncation="longest_first", max_length=max_len)
        assert ids.to_list() == expected["input_ids"]
        assert types.to_list() == expected["token_type_ids"]


def test_single_text_truncation_keeps_cls_and_sep(vocab_file):
    enc = text_encoder.BertTextEncoder(vocab_file, True, 8)
    ids, _, untruncated = enc.encode_with_lengths(tf.constant(["one two three four five six "
                                                               "seven eight nine", "hi"]))
    rows = ids.to_list()
    assert len(rows[0]) == 8 and rows[0][0] == 101 and rows[0][-1] == 102
    assert untruncated.numpy().tolist() == [11, 3]


def test_encoder_survives_saved_model_round_trip(encoder, tmp_path):
    """No custom op: the SavedModel, Hugging Face's normalisation included
    (wordpiece_normalizer.py), loads in a fresh interpreter with only tensorflow and
    tensorflow_text and gives the in-process ids."""

    class Serving(tf.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, text):
            ids, _ = self.encoder(text)
            return {"input_ids": ids.to_tensor()}

    module = Serving()
    tf.saved_model.save(module, str(tmp_path / "sm"),
                        signatures={"serving_default": module.serve})
    texts = ["Crème brûlée, please!", "ok", "Straße\x00ΣΑΣ\u200b ﬁne\ufffd", "ส" * 101]
    served = fresh_load.predict(str(tmp_path / "sm"), {"text": texts})
    want = encoder(tf.constant(texts))[0].to_tensor().numpy().tolist()
    assert np.asarray(served["input_ids"], np.int64).tolist() == want


def test_numpy_assembly_matches_the_tensorflow_encoder(vocab_file):
    """The step's encode_numpy and the exported encode_with_lengths give identical output."""
    words = "the quick brown fox jumps over a lazy dog again and again".split()
    texts = [" ".join(words[:n]) or "x" for n in range(12) for _ in range(12)]
    pairs = [" ".join(reversed(words[:n])) or "y" for _ in range(12) for n in range(12)]
    sst2 = ([line.rsplit("\t", 1)[0] for line in SST2.read_text(encoding="utf-8")
             .splitlines()[1:]] if SST2.is_file() else texts)
    for max_len, batches in ((128, [(sst2, None)]), (8, [(texts, pairs), (texts, None)]),
                             (11, [(texts, pairs)]), (16, [(texts, pairs), (sst2, None)])):
        enc = text_encoder.BertTextEncoder(vocab_file, True, max_len)
        for first, second in batches + [([], None), ([""], [""])]:
            ids, types, untruncated = enc.encode_with_lengths(
                tf.constant(first, tf.string),
                None if second is None else tf.constant(second, tf.string))
            got = enc.encode_numpy(first, second)
            want = (ids.flat_values, ids.row_lengths(), types.flat_values, untruncated)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w.numpy())


def test_tokenizer_models_are_cached_on_disk(vocab_file, tmp_path, monkeypatch):
    vocab = vocab_file.read_text(encoding="utf-8").splitlines()
    monkeypatch.setenv(text_encoder.MODEL_CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(text_encoder, "_models", {})
    built = text_encoder.tokenizer_models(vocab)
    (cached,) = tmp_path.glob("*.bin")
    monkeypatch.setattr(text_encoder, "_models", {})
    assert text_encoder.tokenizer_models(vocab) == built  # read back from disk
    assert text_encoder.tokenizer_models(vocab[:-1]) != built  # the vocabulary is the key
    assert len(list(tmp_path.glob("*.bin"))) == 2
    cached.write_bytes(cached.read_bytes()[:-1] + b"?")  # corrupt: rebuilt, not trusted
    monkeypatch.setattr(text_encoder, "_models", {})
    assert text_encoder.tokenizer_models(vocab) == built
    monkeypatch.setenv(text_encoder.MODEL_CACHE_ENV, "")  # disabled
    assert text_encoder.model_cache_dir() is None


def test_encoder_falls_back_to_the_public_api_when_the_private_builders_move(
        vocab_file, monkeypatch):
    """tensorflow_text's model builders are private (pinned version); without them the
    encoder uses the public FastBertTokenizer(vocab=...) and gives the same ids."""
    texts = tf.constant(["Crème brûlée, please!", "ok", "", "a " * 40, "unaffable xyzzy"])
    pairs = tf.constant(["one", "two words", "x", "b " * 30, "!"])
    private = text_encoder.BertTextEncoder(vocab_file, True, 16)
    want = [private(texts), private(texts, pairs)]
    monkeypatch.setattr(text_encoder, "model_builders", lambda: None)
    monkeypatch.setattr(text_encoder, "_models", {})
    monkeypatch.setenv(text_encoder.MODEL_CACHE_ENV, "")  # no disk cache to read them from
    assert text_encoder.tokenizer_models(["[PAD]", "[CLS]", "[SEP]"]) is None
    public = text_encoder.BertTextEncoder(vocab_file, True, 16)
    for got, expected in zip([public(texts), public(texts, pairs)], want):
        assert [g.to_list() for g in got] == [w.to_list() for w in expected]


# --- record serialization ----------------------------------------------------------------
def _reference_examples(ids, types, labels):
    """What the previous implementation wrote (nested tf.io.encode_proto, field order
    input_ids, token_type_ids, label): the vectorized writer must stay byte-identical, so
    the encoder version (a cache key part, tasks/model/families.py) did not change."""
    def encode(batch, message, field, values):
        return tf.io.encode_proto(tf.fill([batch, 1], tf.shape(values)[1]), [values], [field],
                                  message)

    def entry(key, values):
        batch = values.nrows(out_type=tf.int32)
        int64_list = tf.io.encode_proto(
            tf.expand_dims(tf.cast(values.row_lengths(), tf.int32), 1), [values.to_tensor()],
            ["value"], "tensorflow.Int64List")
        feature = encode(batch, "tensorflow.Feature", "int64_list",
                         tf.expand_dims(int64_list, 1))
        return tf.io.encode_proto(tf.fill([batch, 2], 1),
                                  [tf.fill([batch, 1], key), tf.expand_dims(feature, 1)],
                                  ["key", "value"], "tensorflow.Features.FeatureEntry")
    batch = tf.shape(labels)[0]
    entries = tf.stack([entry("input_ids", ids), entry("token_type_ids", types),
                        entry("label", tf.RaggedTensor.from_tensor(labels[:, None]))], 1)
    features = encode(batch, "tensorflow.Features", "feature", entries)
    return encode(batch, "tensorflow.Example", "features", features[:, None]).numpy().tolist()


# Every varint size from 1 to 10 bytes (a negative int64 takes 10), around each boundary.
_EDGES = [0, 1, 127, 128, 16383, 16384, 2 ** 21 - 1, 2 ** 21, 2 ** 28, 2 ** 35, 2 ** 42,
          2 ** 49, 2 ** 56, 2 ** 63 - 1, -1, -(2 ** 63)]


def test_serialize_examples_round_trip():
    rows = [[101, 7592, 102], [101, 102], _EDGES, [5] * 300, [30521] * 2]
    types = [[0, 0, 0], [0, 1], [1] * len(_EDGES), [0, 1] * 150, [0, 0]]
    labels = [2, 0, -5, 2 ** 40, 1]
    records = tfrecord_io.serialize_examples(tf.ragged.constant(rows, tf.int64),
                                             tf.ragged.constant(types, tf.int64), labels)
    for record, ids, tt, y in zip(records, rows, types, labels):
        expected = tf.train.Example(features=tf.train.Features(feature={
            "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
            "token_type_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=tt)),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[y]))}))
        assert tf.train.Example.FromString(record) == expected
        assert len(record) == expected.ByteSize()
    parsed = tf.io.parse_example(records, {"input_ids": tf.io.RaggedFeature(tf.int64),
                                           "token_type_ids": tf.io.RaggedFeature(tf.int64),
                                           "label": tf.io.FixedLenFeature([], tf.int64)})
    assert parsed["input_ids"].to_list() == rows
    assert parsed["token_type_ids"].to_list() == types
    assert parsed["label"].numpy().tolist() == labels
    assert records == _reference_examples(tf.ragged.constant(rows, tf.int64),
                                          tf.ragged.constant(types, tf.int64),
                                          tf.constant(labels, tf.int64))


def test_records_are_identical_to_tfrecordwriter_output(encoder, tmp_path):
    texts = ["Crème brûlée, please!", "ok", "", "a " * 200, "the end"]
    ids, lengths, types, _ = encoder.encode_numpy(texts)
    labels = np.array([1, 0, 3, 2, 1], np.int64)
    framed, starts = tfrecord_io.example_records(ids, lengths, types, labels, framed=True)
    bare, _ = tfrecord_io.example_records(ids, lengths, types, labels, framed=False)
    with tf.io.TFRecordWriter(str(tmp_path / "ref.tfrecord")) as writer:
        for record in _reference_examples(
                tf.RaggedTensor.from_row_lengths(ids, lengths),
                tf.RaggedTensor.from_row_lengths(types, lengths), tf.constant(labels)):
            writer.write(record)
    assert framed.tobytes() == (tmp_path / "ref.tfrecord").read_bytes()
    assert len(starts) == 6 and starts[-1] == len(framed) == len(bare) + 16 * 5
    empty, empty_starts = tfrecord_io.example_records(ids[:0], lengths[:0], types[:0],
                                                      labels[:0], framed=True)
    assert len(empty) == 0 and empty_starts.tolist() == [0]


# --- the step ----------------------------------------------------------------------------
def _prepare(root, run_key="run1", **overrides):
    cfg = parse_config({"artifact_root": str(root), "num_shards": 3, **overrides})
    ctx = RunContext(str(root), "dag", run_key)
    data.run(cfg, ctx)
    return cfg, ctx


def _records(shards):
    return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(shards)]


def test_run_writes_manifest_and_shards(tmp_path):
    cfg, ctx = _prepare(tmp_path, max_seq_length=16)
    manifest = storage.read_json(tokenize.run(cfg, ctx))
    data_manifest = storage.read_json(ctx.manifest_uri("data"))
    assert manifest["reused"] is False and manifest["labels"] == data_manifest["labels"]
    assert manifest["vocab_size"] == 30522 and manifest["max_seq_length"] == 16
    for name in ("train", "eval"):
        split = manifest["splits"][name]
        assert split["num_examples"] == data_manifest["splits"][name]["num_examples"]
        assert len(split["shards"]) == 3
        assert sum(split["length_histogram"]["counts"]) == split["num_examples"]
        assert 0 < split["num_truncated"] < split["num_examples"]
        records = _records(split["shards"])
        assert len(records) == split["num_examples"]
        lengths = [len(r.features.feature["input_ids"].int64_list.value) for r in records]
        assert max(lengths) == 16 and sum(n == 16 for n in lengths) >= split["num_truncated"]
    first_row = json.loads(storage.read_text(data_manifest["splits"]["train"]["shards"][0])
                           .splitlines()[0])
    first = _records(manifest["splits"]["train"]["shards"][:1])[0].features.feature
    assert first["label"].int64_list.value[0] == first_row["label"]


def test_a_validation_split_is_tokenized_and_keyed_apart(tmp_path):
    cfg, ctx = _prepare(tmp_path / "two", max_seq_length=16)
    two = storage.read_json(tokenize.run(cfg, ctx))
    cfg, ctx = _prepare(tmp_path / "three", max_seq_length=16, validation_fraction=0.3)
    three = storage.read_json(tokenize.run(cfg, ctx))
    data_manifest = storage.read_json(ctx.manifest_uri("data"))
    assert set(two["splits"]) == {"train", "eval"}
    records = _records(three["splits"]["validation"]["shards"])
    assert len(records) == data_manifest["splits"]["validation"]["num_examples"] > 0
    assert two["content_hash"] != three["content_hash"]
    # The test rows are the same, so are their records.
    assert _records(two["splits"]["eval"]["shards"]) == _records(three["splits"]["eval"]["shards"])


def test_shards_are_byte_identical_across_runs(tmp_path):
    shards = []
    for root in (tmp_path / "a", tmp_path / "b"):
        cfg, ctx = _prepare(root)
        shards.append(storage.read_json(tokenize.run(cfg, ctx))["splits"]["train"]["shards"])
    for a, b in zip(*shards):
        assert open(a, "rb").read() == open(b, "rb").read()


def test_cache_is_reused_and_not_rewritten(tmp_path):
    cfg, ctx = _prepare(tmp_path)
    first = storage.read_json(tokenize.run(cfg, ctx))
    shard = first["splits"]["train"]["shards"][0]
    mtime = storage.local_path(shard).stat().st_mtime_ns
    time.sleep(0.01)
    cfg2, ctx2 = _prepare(tmp_path, run_key="run2")
    second = storage.read_json(tokenize.run(cfg2, ctx2))
    assert second["reused"] is True and second["content_hash"] == first["content_hash"]
    assert second["splits"] == first["splits"]
    assert storage.local_path(shard).stat().st_mtime_ns == mtime
    # A different tokenization setting is a different cache entry.
    cfg3, ctx3 = _prepare(tmp_path, run_key="run3", max_seq_length=32)
    assert storage.read_json(tokenize.run(cfg3, ctx3))["content_hash"] != first["content_hash"]


def test_incomplete_cache_is_rebuilt(tmp_path):
    cfg, ctx = _prepare(tmp_path)
    first = storage.read_json(tokenize.run(cfg, ctx))
    storage.local_path(first["splits"]["eval"]["shards"][-1]).unlink()  # interrupted upload
    again = storage.read_json(tokenize.run(cfg, ctx))
    assert again["reused"] is False
    assert all(storage.exists(s) for s in again["splits"]["eval"]["shards"])


def test_pair_inputs_get_segment_ids(tmp_path):
    rows = [{"q": f"question {i} about shipping", "a": f"answer {i}", "y": "yes" if i % 2
             else "no"} for i in range(12)]
    train = tmp_path / "pairs.jsonl"
    train.write_text("\n".join(json.dumps(r) for r in rows))
    cfg, ctx = _prepare(tmp_path, train_uri=str(train), eval_uri="", text_column="q",
                        text_pair_column="a", label_column="y")
    manifest = storage.read_json(tokenize.run(cfg, ctx))
    assert manifest["has_pair"] is True
    record = _records(manifest["splits"]["train"]["shards"])[0].features.feature
    ids = list(record["input_ids"].int64_list.value)
    types = list(record["token_type_ids"].int64_list.value)
    assert ids.count(102) == 2 and types[0] == 0 and types[-1] == 1
    assert types == [0] * (ids.index(102) + 1) + [1] * (len(ids) - ids.index(102) - 1)


def test_demo_data_tokenizes(tmp_path):
    assert (DEMO_DIR / "train.tsv").is_file()
    cfg, ctx = _prepare(tmp_path)
    manifest = storage.read_json(tokenize.run(cfg, ctx))
    assert manifest["splits"]["train"]["num_truncated"] == 0


def test_streamed_shards_equal_whatever_the_chunking(tmp_path, monkeypatch):
    """Prepared data in many small shards, read in tiny blocks and tokenized in small chunks,
    gives the same TFRecord bytes and statistics (and the same cache key) as one shard read
    whole: the step streams shard by shard and chunk by chunk without changing its output."""
    outputs = []
    for root, shard_rows, block, chunk in ((tmp_path / "a", 1_000_000, 4 << 20, 8192),
                                           (tmp_path / "b", 37, 101, 16)):
        monkeypatch.setattr(prepared, "SHARD_ROWS", shard_rows)
        monkeypatch.setattr(tokenize, "_READ_BLOCK", block)
        monkeypatch.setattr(tokenize, "_CHUNK_ROWS", chunk)
        cfg, ctx = _prepare(root, max_seq_length=16)
        data_manifest = storage.read_json(ctx.manifest_uri("data"))
        manifest = storage.read_json(tokenize.run(cfg, ctx))
        shards = {name: [open(s, "rb").read() for s in split["shards"]]
                  for name, split in manifest["splits"].items()}
        stats = {name: {k: v for k, v in split.items() if k != "shards"}
                 for name, split in manifest["splits"].items()}
        outputs.append((manifest["content_hash"], shards, stats))
        assert len(data_manifest["splits"]["train"]["shards"]) == (
            -(-data_manifest["splits"]["train"]["num_examples"] // shard_rows))
    assert outputs[0] == outputs[1]


def test_library_tfrecord_writer_writes_the_same_bytes(tmp_path, monkeypatch):
    """The comparison path of the scale benchmark (tf.io.encode_proto + TFRecordWriter) is
    byte-identical to the hand-written one, so the benchmark compares equal work."""
    shards = []
    for root, writer in ((tmp_path / "hand", ""), (tmp_path / "lib", "library")):
        monkeypatch.setenv("BERTFLOW_TFRECORD_WRITER", writer)
        cfg, ctx = _prepare(root, max_seq_length=16)
        manifest = storage.read_json(tokenize.run(cfg, ctx))
        shards.append([open(s, "rb").read() for split in manifest["splits"].values()
                       for s in split["shards"]])
    assert shards[0] == shards[1]


def test_float_labels_are_written_as_a_float_list():
    """Multi-hot vectors and scores (float32 [n, k]) become each record's `label` FloatList,
    as protobuf packs it."""
    from tasks.io.tfrecord_io import example_records

    ids, lengths, types = np.array([2, 5, 3, 2, 300, 7, 3]), np.array([3, 4]), np.zeros(7)
    for labels in (np.array([[0, 1, 1], [1, 0, 0]], np.float32),
                   np.array([[1.5], [-2.25]], np.float32)):
        buf, starts = example_records(ids, lengths, types, labels, framed=False)
        data = buf.tobytes()
        for k, (a, b) in enumerate(zip(starts[:-1], starts[1:])):
            feature = tf.train.Example.FromString(data[a:b]).features.feature
            assert list(feature["label"].float_list.value) == labels[k].tolist()
            assert len(feature["input_ids"].int64_list.value) == lengths[k]
