"""base_model from every place a checkpoint lives: local folders, gs:// and s3:// folders (the
storage emulators of tests/storage_servers.py), the Hugging Face Hub and the champion.

The Hub is tests/fake_hub.py on loopback, driven by the real huggingface_hub client through
HF_ENDPOINT (no Hub can be reached here); everything else is real. Checkpoints are the tiny
random BERT of tests/train_helpers.py.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid

import pytest

from fake_hub import FakeHub
from storage_servers import BUCKET, S3_CONN_ID, gcs_emulator, s3_server  # noqa: F401
from tasks.config import RunConfig
from tasks.io.uris import join_uri, sha256_file
from tasks.errors import ConfigError
from tasks.io import storage
from tasks.training import checkpoint, checkpoint_sources
from test_deberta_steps import deberta_dir  # noqa: F401
from test_roberta_steps import roberta_dir  # noqa: F401
from test_xlm_roberta_steps import xlmr_dir  # noqa: F401
from train_helpers import LABELS, write_tiny_model

TOKEN = "hf_bertflow_test_token_5b1e"  # stands for a user's Hub token
HF_CONN = "bertflow_hf"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTFLOW_CHECKPOINT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    checkpoint_sources._resolved.clear()
    yield tmp_path / "cache"
    checkpoint_sources._resolved.clear()


def variant(tmp_path, tiny, name: str, drop: str = "", **config):
    """A copy of the tiny checkpoint without file `drop`, with config.json fields changed."""
    folder = tmp_path / name
    shutil.copytree(tiny, folder)
    if drop:
        (folder / drop).unlink()
    if config:
        values = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**values, **config}))
    return folder


def refused(cfg: RunConfig, *fragments: str) -> str:
    with pytest.raises(ConfigError) as err:
        checkpoint_sources.check(cfg)
    message = str(err.value)
    assert err.value.field == "base_model", message
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- parsing and local folders --------------------------------------------------------------
def test_each_form_is_recognised(tmp_path):
    parse = checkpoint_sources.parse
    assert parse("").kind == "default"
    assert parse(str(tmp_path)).kind == "local"
    assert parse("./models/bert").kind == "local"
    assert parse("gs://b/models/bert/") == checkpoint_sources.Source(
        "bucket", "gs://b/models/bert/", "gs://b/models/bert")
    assert parse("s3://b/bert").kind == "bucket"
    hub = parse("google-bert/bert-base-uncased@v1.0")
    assert (hub.kind, hub.location, hub.revision) == ("hub", "google-bert/bert-base-uncased",
                                                      "v1.0")
    assert parse("hf://org/name@refs/pr/1").revision == "refs/pr/1"
    assert parse("champion") == checkpoint_sources.Source("champion", "champion", "")
    pinned = parse("champion:reviews@v20260101T000000-ab12cd34")
    assert (pinned.location, pinned.revision) == ("reviews", "v20260101T000000-ab12cd34")
    with pytest.raises(ConfigError, match="base_model.*unsupported scheme"):
        parse("https://example.com/bert")


def test_local_folder_resolves_in_place_with_its_hashes(tiny, cache):
    resolved = checkpoint.resolve_base_checkpoint(RunConfig(base_model=str(tiny)))
    assert resolved.path == tiny and resolved.kind == "local"
    assert resolved.weights == "model.safetensors"
    assert resolved.sha256 == sha256_file(tiny / "model.safetensors")
    assert set(resolved.files) == {"config.json", "vocab.txt", "model.safetensors"}
    assert not cache.exists()  # nothing copied


def test_local_bad_values_are_refused(tmp_path, tiny, cache):
    refused(RunConfig(base_model=str(tmp_path / "nope")), "not found")
    refused(RunConfig(base_model=str(variant(tmp_path, tiny, "novocab", drop="vocab.txt"))),
            "missing vocab.txt")
    refused(RunConfig(base_model=str(variant(tmp_path, tiny, "noweights",
                                             drop="model.safetensors"))),
            "missing model.safetensors")
    refused(RunConfig(base_model=str(variant(tmp_path, tiny, "t5",
                                             model_type="t5"))),
            "model_type 't5'", "supported: bert, distilbert, electra, roberta",
            "google-bert/bert-base-uncased", "microsoft/deberta-v3-base")
    size = len((tiny / "vocab.txt").read_text().splitlines())
    refused(RunConfig(base_model=str(variant(tmp_path, tiny, "small", vocab_size=size - 1))),
            f"vocab.txt has {size} ids but config.json's vocab_size (the embedding matrix) is "
            f"{size - 1}")
    # A RoBERTa config beside a WordPiece vocabulary: its tokenizer files are named.
    refused(RunConfig(base_model=str(variant(tmp_path, tiny, "roberta", model_type="roberta"))),
            "missing vocab.json, merges.txt (a roberta checkpoint's tokenizer is vocab.json "
            "and merges.txt)")


def test_a_local_path_of_remote_workers_is_left_to_them(tmp_path):
    """For remote backends a local path names a folder in the worker image, which the
    validate task (on the Airflow worker) cannot see: the workers check it when they load."""
    cfg = RunConfig(base_model=str(tmp_path / "in-the-image"), provisioner="kubernetes")
    assert checkpoint_sources.check(cfg) == cfg.base_model
    refused(cfg.model_copy(update={"provisioner": "local"}), "not found")


# --- buckets -------------------------------------------------------------------------------
@pytest.fixture(params=["gs", "s3"])
def bucket(request, tmp_path, tiny):
    """(prefix URI, cfg overrides) on the GCS emulator or moto's S3 server, with the tiny
    checkpoint uploaded to {prefix}/bert and broken copies beside it."""
    request.getfixturevalue("gcs_emulator" if request.param == "gs" else "s3_server")
    conns = {} if request.param == "gs" else {"aws_conn_id": S3_CONN_ID}
    storage.configure(storage.Connections(aws_conn_id=conns.get("aws_conn_id", "")))
    prefix = f"{request.param}://{BUCKET}/{uuid.uuid4().hex[:12]}"
    storage.upload_dir(tiny, f"{prefix}/bert")
    (tmp_path / "readme").mkdir()
    (tmp_path / "readme" / "README.md").write_text("not a checkpoint")
    storage.upload_dir(variant(tmp_path, tiny, "novocab", drop="vocab.txt"), f"{prefix}/novocab")
    storage.upload_dir(variant(tmp_path, tiny, "t5", model_type="t5"),
                       f"{prefix}/t5")
    yield prefix, conns
    storage.configure(storage.Connections())


def test_bucket_folder_is_fetched_once_verified_and_reused(bucket, tiny, cache, monkeypatch):
    prefix, conns = bucket
    cfg = RunConfig(base_model=f"{prefix}/bert/", **conns)
    assert checkpoint_sources.check(cfg) == cfg.base_model
    reads = []
    real = storage.iter_bytes
    monkeypatch.setattr(storage, "iter_bytes", lambda uri, *a: reads.append(uri) or real(uri, *a))

    first = checkpoint.resolve_base_checkpoint(cfg)
    assert first.kind == "bucket" and first.location == f"{prefix}/bert"
    assert first.path.is_relative_to(cache)
    assert first.sha256 == sha256_file(tiny / "model.safetensors")
    for name in ("config.json", "vocab.txt", "model.safetensors"):
        assert (first.path / name).read_bytes() == (tiny / name).read_bytes()
    assert sorted(u.rsplit("/", 1)[1] for u in reads) == ["config.json", "model.safetensors",
                                                          "vocab.txt"]
    # Another step (a new process: the in-process memo cleared) reuses the cache entry.
    checkpoint_sources._resolved.clear()
    again = checkpoint.resolve_base_checkpoint(cfg)
    assert again.path == first.path and len(reads) == 3
    # A damaged entry (size differs from the record) is fetched again.
    with open(first.path / "model.safetensors", "ab") as f:
        f.write(b"x")
    checkpoint_sources._resolved.clear()
    repaired = checkpoint.resolve_base_checkpoint(cfg)
    assert len(reads) == 6 and repaired.sha256 == first.sha256
    # New content under the same URI is a new cache entry.
    storage.write_text(f"{prefix}/bert/vocab.txt", (tiny / "vocab.txt").read_text() + "w95\n")
    checkpoint_sources._resolved.clear()
    assert checkpoint.resolve_base_checkpoint(cfg).path != first.path


def test_bucket_bad_values_are_refused(bucket, cache):
    prefix, conns = bucket
    refused(RunConfig(base_model=f"{prefix}/novocab", **conns), "missing vocab.txt")
    refused(RunConfig(base_model=f"{prefix}/t5", **conns), "model_type 't5'")
    refused(RunConfig(base_model=f"{prefix}/nothing-here", **conns), "holds no files")
    scheme = prefix.split("://")[0]
    refused(RunConfig(base_model=f"{scheme}://no-such-bucket-{uuid.uuid4().hex[:6]}/bert",
                      **conns), "cannot read", "read access")


@pytest.mark.parametrize("bucket", ["gs"], indirect=True)
def test_bucket_the_run_may_not_read_is_refused_naming_base_model(bucket, cache, monkeypatch):
    """A bucket that exists but denies the run's credentials (403 from the service, injected by
    tests/fault_proxy.py in front of the emulator) is refused before any compute, naming
    base_model and the access to grant."""
    from fault_proxy import FaultProxy
    from tasks.io import cloud_storage

    prefix, conns = bucket
    proxy = FaultProxy(os.environ["STORAGE_EMULATOR_HOST"])
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    monkeypatch.setattr(cloud_storage, "_clients", {})
    proxy.fail(lambda request: True, status=403, content_type="application/json",
               body=json.dumps({"error": {"code": 403, "message": "caller does not have "
                                          "storage.objects.list access"}}).encode(), times=None)
    try:
        message = refused(RunConfig(base_model=f"{prefix}/bert", **conns), "cannot read",
                          "read access to that bucket")
        assert f"{prefix}/bert" in message and proxy.count(lambda request: True) >= 1
    finally:
        proxy.stop()


# --- the Hub -------------------------------------------------------------------------------
@pytest.fixture
def hub(tmp_path, tiny, monkeypatch):
    with FakeHub() as fake:
        extra = variant(tmp_path, tiny, "extra")
        (extra / "pytorch_model.bin").write_bytes(b"\0" * 4096)  # must never be fetched
        (extra / "README.md").write_text("model card")
        fake.main = fake.add("org/tiny-bert", extra)
        retrained = variant(tmp_path, tiny, "v2", num_hidden_layers=1)
        fake.v2 = fake.add("org/tiny-bert", retrained, ref="v2")
        fake.add("org/gated-bert", tiny, gated=True, tokens=(TOKEN,))
        fake.add("org/novocab", tiny, skip=("vocab.txt",))
        fake.add("org/t5", variant(tmp_path, tiny, "t5", model_type="t5"))
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        yield fake


def test_hub_revisions_fetch_only_what_loading_needs(hub, cache, tiny):
    main = checkpoint.resolve_base_checkpoint(RunConfig(base_model="org/tiny-bert"))
    assert (main.kind, main.location, main.revision) == ("hub", "org/tiny-bert", hub.main)
    assert sorted(p.name for p in main.path.iterdir()) == ["config.json", "model.safetensors",
                                                           "vocab.txt"]
    assert main.path.is_relative_to(cache / "hub")
    assert main.sha256 == sha256_file(tiny / "model.safetensors")
    assert hub.file_gets("pytorch_model.bin") == 0 and hub.file_gets("README.md") == 0

    tagged = checkpoint.resolve_base_checkpoint(RunConfig(base_model="org/tiny-bert@v2"))
    by_commit = checkpoint.resolve_base_checkpoint(
        RunConfig(base_model=f"org/tiny-bert@{hub.v2}"))
    assert tagged.revision == by_commit.revision == hub.v2 != hub.main
    assert json.loads((tagged.path / "config.json").read_text())["num_hidden_layers"] == 1
    assert hub.file_gets("model.safetensors") == 1  # v2 has main's weights: one blob, kept once


def test_hub_cache_is_reused_and_offline_mode_reads_it(hub, cache, monkeypatch):
    cfg = RunConfig(base_model="org/tiny-bert")
    first = checkpoint.resolve_base_checkpoint(cfg)
    checkpoint_sources._resolved.clear()
    again = checkpoint.resolve_base_checkpoint(cfg)
    assert again.path == first.path and hub.file_gets("model.safetensors") == 1

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    checkpoint_sources._resolved.clear()
    seen = len(hub.requests)
    offline = checkpoint.resolve_base_checkpoint(cfg)
    assert offline.path == first.path and offline.sha256 == first.sha256
    assert len(hub.requests) == seen  # not one request
    checkpoint_sources.check(cfg)  # validate works offline from the cache too
    refused(RunConfig(base_model="org/t5"), "HF_HUB_OFFLINE", "not in the cache")


def test_hub_bad_values_are_refused_without_fetching_weights(hub, cache):
    refused(RunConfig(base_model="org/no-such-model"), "no model org/no-such-model",
            "check the id")
    refused(RunConfig(base_model="org/tiny-bert@v9"), "no revision 'v9'",
            "branch, tag or commit")
    refused(RunConfig(base_model="org/novocab"), "missing vocab.txt")
    refused(RunConfig(base_model="org/t5"), "model_type 't5'")
    refused(RunConfig(base_model="org/gated-bert"), "is gated", "hf_conn_id")
    assert hub.file_gets("model.safetensors") == 0  # validate reads config.json and listings only


def test_gated_repo_with_the_connection_token(hub, cache, monkeypatch):
    conn = {"conn_type": "generic", "password": TOKEN}
    monkeypatch.setenv(f"AIRFLOW_CONN_{HF_CONN.upper()}", json.dumps(conn))
    cfg = RunConfig(base_model="org/gated-bert", hf_conn_id=HF_CONN)
    checkpoint_sources.check(cfg)
    assert checkpoint.resolve_base_checkpoint(cfg).revision
    assert ("Bearer " + TOKEN) in {auth for _, _, auth in hub.requests}
    # HF_TOKEN works as well; a token without access is told so (on an empty cache: files
    # cached by commit are not asked for again).
    checkpoint_sources._resolved.clear()
    shutil.rmtree(cache)
    monkeypatch.setenv("HF_TOKEN", "hf_someone_else")
    refused(RunConfig(base_model="org/gated-bert"), "is gated")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    checkpoint_sources.check(RunConfig(base_model="org/gated-bert"))
    with pytest.raises(ConfigError, match="hf_conn_id.*not defined"):
        checkpoint_sources.check(RunConfig(base_model="org/gated-bert", hf_conn_id="nope"))


def test_hf_conn_id_reaches_workers_as_a_connection(monkeypatch):
    from tasks.io import credentials

    monkeypatch.setenv(f"AIRFLOW_CONN_{HF_CONN.upper()}", json.dumps(
        {"conn_type": "generic", "password": TOKEN}))
    env = credentials.worker_env(RunConfig(hf_conn_id=HF_CONN))
    assert json.loads(env[f"AIRFLOW_CONN_{HF_CONN.upper()}"])["password"] == TOKEN


def test_gated_repo_is_staged_in_the_bucket_for_workers_without_connections(
        hub, cache, gcs_emulator, monkeypatch, tmp_path):
    """Vertex AI and TPU VM workers get no connections: validate stages the gated repo in the
    run's bucket with the controller's token; a worker with no token at all reads it there and
    still records the Hub repo and commit."""
    from tasks.provision.backends import backend_for
    from tasks.training import hub_staging

    root = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{HF_CONN.upper()}", json.dumps(
        {"conn_type": "generic", "password": TOKEN}))
    cfg = RunConfig(base_model="org/gated-bert", hf_conn_id=HF_CONN, artifact_root=root)
    assert [backend_for(cfg.model_copy(update={"provisioner": p})).receives_connections
            for p in ("local", "kubernetes", "vertex_ai", "tpu_vm")] == [True, True, False,
                                                                         False]
    controller = checkpoint_sources.resolve(cfg)
    staged = hub_staging.stage_for_workers(cfg)
    assert staged == f"{root}/checkpoints/hub/org--gated-bert/{controller.revision}"
    assert storage.is_complete(staged)
    uploads = len(storage.list_uris(staged))
    assert hub_staging.stage_for_workers(cfg) == staged  # once per commit
    assert len(storage.list_uris(staged)) == uploads
    # Anything else is left as it is.
    assert hub_staging.stage_for_workers(RunConfig(base_model="org/tiny-bert")) == "org/tiny-bert"

    # The worker: no connection, no HF_TOKEN, an empty cache; the Hub sees no request.
    monkeypatch.delenv(f"AIRFLOW_CONN_{HF_CONN.upper()}")
    monkeypatch.setenv("BERTFLOW_CHECKPOINT_CACHE", str(tmp_path / "worker-cache"))
    checkpoint_sources._resolved.clear()
    seen = len(hub.requests)
    worker = checkpoint.resolve_base_checkpoint(cfg.model_copy(
        update={"base_model": staged, "hf_conn_id": ""}))
    assert len(hub.requests) == seen
    assert (worker.kind, worker.location, worker.revision, worker.source) == (
        "hub", "org/gated-bert", controller.revision, "org/gated-bert")
    assert worker.sha256 == controller.sha256 and worker.files == controller.files
    # A folder whose weights no longer match its origin record is reported as the bucket.
    storage.write_bytes(f"{staged}/model.safetensors", b"retrained elsewhere")
    checkpoint_sources._resolved.clear()
    changed = checkpoint_sources.resolve(cfg.model_copy(update={"base_model": staged,
                                                                "hf_conn_id": ""}))
    assert changed.kind == "bucket" and changed.location == staged


# --- champion ------------------------------------------------------------------------------
def test_champion_is_pinned_and_read_from_the_export_location(tmp_path, tiny, cache):
    export_uri = str(tmp_path / "models")
    cfg = RunConfig(base_model="champion", export_uri=export_uri, model_name="reviews")
    refused(cfg, "model reviews has no champion yet", "leave base_model empty")
    version = "v20260101T000000-0123abcd"
    version_dir = tmp_path / "models" / "reviews" / version
    shutil.copytree(tiny, version_dir)
    storage.write_json(join_uri(export_uri, "reviews", "CHAMPION.json"),
                       {"version": version, "version_uri": str(version_dir)})
    pinned = checkpoint_sources.check(cfg)
    assert pinned == f"champion:reviews@{version}"
    resolved = checkpoint.resolve_base_checkpoint(cfg.model_copy(update={"base_model": pinned}))
    assert (resolved.kind, resolved.revision, resolved.path) == ("champion", version,
                                                                 version_dir)
    other = RunConfig(base_model="champion:reviews", export_uri=export_uri, model_name="x")
    assert checkpoint_sources.check(other) == pinned
    (version_dir / "model.safetensors").unlink()
    refused(cfg, "without a Hugging Face checkpoint")


def test_classifier_head_is_kept_only_for_the_same_labels(tmp_path):
    import numpy as np

    trained = write_tiny_model(tmp_path / "clf", id2label=dict(enumerate(LABELS)),
                               label2id={k: i for i, k in enumerate(LABELS)})
    kept = checkpoint.load_classifier(trained, LABELS)
    fresh = checkpoint.load_classifier(trained, ["pos", "neg"])
    original = kept.head.classifier.kernel.numpy()
    assert "reused (labels" in checkpoint.describe_head(trained, LABELS)
    assert "differ from this run's" in checkpoint.describe_head(trained, ["pos", "neg"])
    assert not np.allclose(fresh.head.classifier.kernel.numpy(), original)
    assert np.allclose(fresh.encoder.weights[0].numpy(), kept.encoder.weights[0].numpy())
    assert checkpoint.head_labels(write_tiny_model(tmp_path / "base")) is None


# --- the tokenizer's casing (tasks/model/casing.py) -----------------------------------------
def cased(tmp_path, tiny, name: str = "cased"):
    """The tiny checkpoint with a tokenizer_config.json that says it is cased."""
    folder = variant(tmp_path, tiny, name)
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    return folder


def test_bucket_casing_is_read_before_the_weights_and_fetched_with_them(bucket, tmp_path, tiny,
                                                                        cache, monkeypatch):
    prefix, conns = bucket
    storage.upload_dir(cased(tmp_path, tiny), f"{prefix}/cased")
    cfg = RunConfig(base_model=f"{prefix}/cased", **conns)
    reads = []
    real = storage.read_bytes
    monkeypatch.setattr(storage, "read_bytes", lambda uri: reads.append(uri) or real(uri))
    found = checkpoint_sources.casing(cfg)
    assert (found.lower_case, found.rule) == (False, "tokenizer_config.json do_lower_case")
    assert not any(u.endswith("model.safetensors") for u in reads)
    resolved = checkpoint.resolve_base_checkpoint(cfg)
    assert (resolved.path / "tokenizer_config.json").is_file()
    assert checkpoint.casing(resolved.path, cfg) == found
    # The tiny checkpoint says nothing but has no capitalised piece: uncased.
    plain = checkpoint_sources.casing(RunConfig(base_model=f"{prefix}/bert", **conns))
    assert plain.lower_case and plain.rule == "vocab.txt has no capitalised pieces"


def test_hub_casing_is_read_online_and_offline(tmp_path, tiny, cache, monkeypatch):
    with FakeHub() as fake:
        fake.add("org/cased-bert", cased(tmp_path, tiny))
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        cfg = RunConfig(base_model="org/cased-bert")
        checkpoint_sources.check(cfg)
        assert checkpoint_sources.casing(cfg).lower_case is False
        assert fake.file_gets("model.safetensors") == 0
        resolved = checkpoint.resolve_base_checkpoint(cfg)
        assert sorted(p.name for p in resolved.path.iterdir()) == [
            "config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        seen = len(fake.requests)
        assert checkpoint_sources.casing(cfg).lower_case is False
        assert len(fake.requests) == seen


def test_a_remote_worker_s_path_is_read_where_it_is_loaded(tmp_path, tiny):
    cfg = RunConfig(base_model=str(cased(tmp_path, tiny)), provisioner="kubernetes",
                    artifact_root="gs://bucket/art")
    assert checkpoint_sources.casing(cfg) is None


# --- RoBERTa from a bucket and the Hub -----------------------------------------------------
@pytest.mark.parametrize("where", ["gs", "s3", "hub"])
def test_a_roberta_checkpoint_fetches_its_bpe_files_and_tokenizes_as_transformers(
        where, request, roberta_dir, cache, monkeypatch):  # noqa: F811
    """vocab.json and merges.txt are fetched with the weights (no vocab.txt is asked for),
    and the fetched folder's in-graph tokenizer gives RobertaTokenizerFast's ids."""
    import tensorflow as tf
    import transformers

    if where == "hub":
        fake = request.getfixturevalue("hub")
        fake.add("org/tiny-roberta", roberta_dir)
        cfg = RunConfig(base_model="org/tiny-roberta")
    else:
        request.getfixturevalue("gcs_emulator" if where == "gs" else "s3_server")
        conns = {} if where == "gs" else {"aws_conn_id": S3_CONN_ID}
        storage.configure(storage.Connections(aws_conn_id=conns.get("aws_conn_id", "")))
        request.addfinalizer(lambda: storage.configure(storage.Connections()))
        prefix = f"{where}://{BUCKET}/{uuid.uuid4().hex[:12]}"
        storage.upload_dir(roberta_dir, f"{prefix}/roberta")
        cfg = RunConfig(base_model=f"{prefix}/roberta", **conns)
    assert checkpoint_sources.check(cfg) == cfg.base_model
    resolved = checkpoint.resolve_base_checkpoint(cfg)
    names = sorted(p.name for p in resolved.path.iterdir())
    assert {"vocab.json", "merges.txt", "config.json", "model.safetensors"} <= set(names)
    assert "vocab.txt" not in names
    encoder = checkpoint.text_encoder(resolved.path, False, 32)
    texts = ["Hello world, it's 2026!", "naïve café  CJK 漢字 emoji 🙂"]
    reference = transformers.RobertaTokenizerFast.from_pretrained(str(roberta_dir))
    assert encoder(tf.constant(texts))[0].to_list() == reference(texts)["input_ids"]


def test_a_deberta_checkpoint_fetches_its_spm_model_from_the_hub(
        request, deberta_dir, cache):  # noqa: F811
    """spm.model (binary) and the tokenizer_config.json that says its casing are fetched with
    the weights, and the fetched folder tokenizes as DebertaV2Tokenizer."""
    import tensorflow as tf
    import transformers

    request.getfixturevalue("hub").add("org/tiny-deberta", deberta_dir)
    cfg = RunConfig(base_model="org/tiny-deberta")
    assert checkpoint_sources.check(cfg) == cfg.base_model
    resolved = checkpoint.resolve_base_checkpoint(cfg)
    names = {p.name for p in resolved.path.iterdir()}
    assert {"spm.model", "tokenizer_config.json", "config.json", "model.safetensors"} <= names
    assert "vocab.txt" not in names
    assert checkpoint.casing(resolved.path, cfg).rule == "tokenizer_config.json do_lower_case"
    encoder = checkpoint.text_encoder(resolved.path, False, 32)
    texts = ["Hello world, it's 2026!", "naïve café  CJK 漢字 emoji 🙂"]
    reference = transformers.DebertaV2Tokenizer.from_pretrained(str(deberta_dir))
    assert encoder(tf.constant(texts))[0].to_list() == reference(texts)["input_ids"]


@pytest.mark.parametrize("where", ["gs", "hub"])
def test_the_family_decides_which_vocabulary_a_folder_with_two_gives(
        where, request, xlmr_dir, tmp_path, cache):  # noqa: F811
    """An XLM-R checkpoint that also holds a vocab.txt: its sentencepiece.bpe.model is
    fetched (the first vocabulary kind found used to be taken, and the fetched folder then
    had no tokenizer for the family)."""
    folder = tmp_path / "xlmr-with-vocab-txt"
    shutil.copytree(xlmr_dir, folder)
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    if where == "hub":
        request.getfixturevalue("hub").add("org/tiny-xlmr", folder)
        cfg = RunConfig(base_model="org/tiny-xlmr")
    else:
        request.getfixturevalue("gcs_emulator")
        prefix = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
        storage.upload_dir(folder, f"{prefix}/xlmr")
        cfg = RunConfig(base_model=f"{prefix}/xlmr")
    assert checkpoint_sources.check(cfg) == cfg.base_model
    resolved = checkpoint.resolve_base_checkpoint(cfg)
    names = {p.name for p in resolved.path.iterdir()}
    assert "sentencepiece.bpe.model" in names and "vocab.txt" not in names
    assert [p.name for p in checkpoint.tokenizer_files(resolved.path)] == [
        "sentencepiece.bpe.model"]
