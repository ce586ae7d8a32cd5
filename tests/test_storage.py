"""The storage interface, run against local disk, the GCS emulator and moto's S3 server."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from fault_proxy import FaultProxy
from storage_servers import (BUCKET, S3_KEY_ID, S3_SECRET, connections,  # noqa: F401
                             gcs_emulator, root, s3_server)
from tasks.io import cloud_storage, storage
from tasks.errors import StorageError


def make_tree(path):
    files = {"a.txt": b"alpha\n", "sub/b.bin": bytes(range(256)) * 4096,  # 1 MiB
             "sub/deeper/c.json": b'{"c": 1}', "empty": b""}
    for rel, data in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    return files


def read_tree(path):
    return {p.relative_to(path).as_posix(): p.read_bytes()
            for p in path.rglob("*") if p.is_file()}


def test_read_write_exists_list_delete(root):
    storage.write_json(f"{root}/run/config.json", {"x": 1})
    storage.write_text(f"{root}/run/step/manifest.json", "{}")
    storage.write_text(f"{root}/run-other.txt", "not inside run/")
    assert storage.read_json(f"{root}/run/config.json") == {"x": 1}
    assert storage.exists(f"{root}/run") and storage.exists(f"{root}/run/config.json")
    assert not storage.exists(f"{root}/run/missing.json")
    assert [u.rsplit("/", 2)[-2:] for u in storage.list_uris(f"{root}/run")] == [
        ["run", "config.json"], ["step", "manifest.json"]]
    assert storage.list_uris(f"{root}/run/config.json") == [f"{root}/run/config.json"]
    storage.delete_prefix(f"{root}/run")
    assert not storage.exists(f"{root}/run")
    assert storage.exists(f"{root}/run-other.txt")


def test_glob_matches_within_one_segment(root):
    for name in ("part-0.csv", "part-1.csv", "part-1.tsv", "nested/part-2.csv"):
        storage.write_text(f"{root}/data/{name}", "x")
    found = storage.glob_uris(f"{root}/data/part-*.csv")
    assert [u.rsplit("/", 1)[1] for u in found] == ["part-0.csv", "part-1.csv"]
    assert storage.glob_uris(f"{root}/data/part-0.csv") == [f"{root}/data/part-0.csv"]
    assert storage.glob_uris(f"{root}/data/nope-*") == []


def test_missing_object_names_the_uri(root):
    with pytest.raises(StorageError, match=r"missing\.json: no such (object|file)"):
        storage.read_bytes(f"{root}/missing.json")


def test_streaming_reads_in_blocks_and_file_upload(root, tmp_path):
    data = bytes(range(256)) * 1000 + b"tail"  # 256,004 bytes: the last block is short
    storage.write_bytes(f"{root}/big.bin", data)
    for block_size in (1 << 16, 100_000, 1 << 20):
        blocks = list(storage.iter_bytes(f"{root}/big.bin", block_size))
        assert b"".join(blocks) == data
        assert len(blocks) == -(-len(data) // block_size)  # ranged reads, not one GET
        assert all(len(b) <= block_size for b in blocks)
        # From a byte offset (a scoring shard's first row): the rest, in ranged blocks.
        rest = list(storage.iter_bytes(f"{root}/big.bin", block_size, start=70_001))
        assert b"".join(rest) == data[70_001:] and all(len(b) <= block_size for b in rest)
    assert list(storage.iter_bytes(f"{root}/big.bin", 1024, start=len(data))) == []
    storage.write_bytes(f"{root}/empty.bin", b"")
    assert list(storage.iter_bytes(f"{root}/empty.bin", 1024)) == []
    with pytest.raises(StorageError, match=r"nope\.bin: no such (object|file)"):
        list(storage.iter_bytes(f"{root}/nope.bin", 1024))
    local = tmp_path / "shard.jsonl"
    local.write_bytes(b'{"a": 1}\n')
    storage.upload_file(local, f"{root}/up/shard.jsonl")
    assert storage.read_bytes(f"{root}/up/shard.jsonl") == b'{"a": 1}\n'
    assert not local.exists()  # moved, not copied


def test_folder_round_trip_keeps_bytes(root, tmp_path):
    files = make_tree(tmp_path / "src")
    storage.upload_dir(tmp_path / "src", f"{root}/folder")
    storage.download_dir(f"{root}/folder", tmp_path / "back")
    assert read_tree(tmp_path / "back") == files
    with pytest.raises(StorageError, match="no such folder"):
        storage.download_dir(f"{root}/nothing-here", tmp_path / "x")


def test_publish_is_complete_and_never_overwritten(root, tmp_path):
    files = make_tree(tmp_path / "v1")
    uri = f"{root}/models/m/v1"
    assert storage.publish_dir(tmp_path / "v1", uri) is True
    manifest = storage.read_json(f"{uri}/{storage.COMPLETE}")
    assert {f["path"]: (f["size"], f["sha256"]) for f in manifest["files"]} == {
        rel: (len(data), hashlib.sha256(data).hexdigest()) for rel, data in files.items()}
    assert storage.is_complete(uri)

    (tmp_path / "v1" / "a.txt").write_bytes(b"changed")
    assert storage.publish_dir(tmp_path / "v1", uri) is False
    assert storage.read_bytes(f"{uri}/a.txt") == b"alpha\n"
    # Staging leaves nothing next to the versions.
    assert [u for u in storage.list_uris(f"{root}/models/m") if "staging" in u] == []


def test_concurrent_publishes_of_different_versions(root, tmp_path):
    make_tree(tmp_path / "src")
    results = {}

    def publish(version):
        results[version] = storage.publish_dir(tmp_path / "src", f"{root}/m/{version}")

    threads = [threading.Thread(target=publish, args=(v,)) for v in ("v1", "v2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"v1": True, "v2": True}
    assert storage.is_complete(f"{root}/m/v1") and storage.is_complete(f"{root}/m/v2")


@pytest.mark.parametrize("kind", ["upload", "copy"])
def test_interrupted_publish_leaves_no_version_and_retry_completes(proxied, kind, tmp_path):
    files = make_tree(tmp_path / "src")
    uri = f"{proxied.root}/models/m/v1"
    # A crash mid-publish, as the server sees it: after two transfers of a kind succeed, the
    # rest fail for good (a permanent error, so no client retries it).
    proxied.proxy.fail(proxied.kinds[kind], **proxied.error(400, "Interrupted"),
                       after=2, times=None)
    with pytest.raises(StorageError, match="Interrupted"):
        storage.publish_dir(tmp_path / "src", uri)
    assert not storage.is_complete(uri)
    proxied.proxy.clear()

    assert storage.publish_dir(tmp_path / "src", uri) is True
    storage.download_dir(uri, tmp_path / "back")
    assert read_tree(tmp_path / "back") == {**files, storage.COMPLETE: (
        tmp_path / "back" / storage.COMPLETE).read_bytes()}
    assert not storage.exists(f"{proxied.root}/models/m/.staging")


def test_compare_and_swap(root):
    uri = f"{root}/CHAMPION.json"
    assert storage.read_versioned(uri) is None
    assert storage.write_if_match(uri, b"one", None) is True
    assert storage.write_if_match(uri, b"again", None) is False
    data, token = storage.read_versioned(uri)
    assert data == b"one"
    assert storage.write_if_match(uri, b"two", token) is True
    assert storage.write_if_match(uri, b"stale", token) is False
    assert storage.read_bytes(uri) == b"two"


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_missing_bucket_is_named(request, scheme, connections):  # noqa: F811
    request.getfixturevalue("gcs_emulator" if scheme == "gs" else "s3_server")
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        storage.read_bytes(f"{scheme}://no-such-bucket/x.json")
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        storage.write_text(f"{scheme}://no-such-bucket/x.json", "x")


@pytest.mark.parametrize("uri", [
    "s3://AKIAXXXX:topsecret@bucket/data.csv",
    "gs://user:topsecret@bucket/data.csv",
    "s3://bucket/data.csv?X-Amz-Signature=topsecret&X-Amz-Credential=AKIA",
    "https://bucket.s3.amazonaws.com/data.csv?X-Amz-Signature=topsecret",
    "gs://bucket/data.csv?X-Goog-Signature=topsecret",
])
def test_uris_with_credentials_are_rejected_without_echoing_them(uri):
    with pytest.raises(StorageError, match="must not embed credentials") as err:
        storage.scheme_of(uri)
    assert "topsecret" not in str(err.value)


def test_s3_access_denied_is_reported(s3_server, monkeypatch):  # noqa: F811
    """A real IAM check: moto enforces a user's policy once auth is switched on."""
    import boto3
    from moto import settings

    admin = dict(endpoint_url=s3_server, region_name="us-east-1",
                 aws_access_key_id="admin", aws_secret_access_key="admin")
    iam = boto3.client("iam", **admin)
    iam.create_user(UserName="reader")
    iam.put_user_policy(UserName="reader", PolicyName="read-only", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
            "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"]}]}))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    monkeypatch.setenv("AIRFLOW_CONN_S3_READER", json.dumps({
        "conn_type": "aws", "login": key["AccessKeyId"], "password": key["SecretAccessKey"],
        "extra": {"endpoint_url": s3_server}}))
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    storage.configure(storage.Connections(aws_conn_id="s3_reader"))
    try:
        with pytest.raises(StorageError, match=r"s3://bertflow-test/denied\.txt: access denied"):
            storage.write_text(f"s3://{BUCKET}/denied.txt", "x")
    finally:
        storage.configure(storage.Connections())


def test_undefined_airflow_connection_is_reported():
    storage.configure(storage.Connections(aws_conn_id="no_such_conn"))
    try:
        with pytest.raises(StorageError, match="connection 'no_such_conn' is not defined"):
            storage.read_bytes(f"s3://{BUCKET}/x")
    finally:
        storage.configure(storage.Connections())


def test_gcs_connection_extra_sets_the_endpoint(gcs_emulator, monkeypatch):  # noqa: F811
    # With the endpoint only in the connection, the client must not need the env var.
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    monkeypatch.setenv("AIRFLOW_CONN_GCS_EMU", json.dumps({
        "conn_type": "google_cloud_platform", "extra": {"endpoint_url": gcs_emulator}}))
    storage.configure(storage.Connections(gcp_conn_id="gcs_emu"))
    try:
        storage.write_text(f"gs://{BUCKET}/via-conn.txt", "hello")
        assert storage.read_text(f"gs://{BUCKET}/via-conn.txt") == "hello"
    finally:
        storage.configure(storage.Connections())


# --- retries: faults injected below the client libraries ----------------------------------
def _object_path(request) -> bool:
    return urlsplit(request.path).path.startswith(f"/{BUCKET}/")


KINDS = {  # which requests the clients send for each kind of transfer
    "gs": {"upload": lambda r: r.method == "POST" and r.path.startswith("/upload/"),
           "download": lambda r: r.method == "GET" and "alt=media" in r.path,
           "copy": lambda r: r.method == "POST" and "/rewriteTo/" in r.path},
    "s3": {"upload": lambda r: (r.method == "PUT" and _object_path(r)
                                and "x-amz-copy-source" not in r.headers),
           "download": lambda r: r.method == "GET" and _object_path(r),
           "copy": lambda r: r.method == "PUT" and "x-amz-copy-source" in r.headers},
}


@dataclass
class Proxied:
    scheme: str
    proxy: FaultProxy
    root: str

    @property
    def kinds(self) -> dict:
        return KINDS[self.scheme]

    def error(self, status: int, code: str) -> dict:
        """A fault as this service words it (GCS: JSON, S3: XML with an error code)."""
        if self.scheme == "gs":
            return {"status": status, "content_type": "application/json", "body": json.dumps(
                {"error": {"code": status, "message": code}}).encode()}
        return {"status": status, "content_type": "application/xml",
                "body": f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()}


@pytest.fixture(params=["gs", "s3"])
def proxied(request, tmp_path, monkeypatch):
    """The store of `request.param` talking to its emulator through a FaultProxy. The retry
    policies are the production ones with millisecond backoff: the same errors are retried
    the same number of times, only sooner."""
    from botocore.retries.standard import ExponentialBackoff
    from google.cloud.storage.retry import DEFAULT_RETRY

    scheme = request.param
    proxy = FaultProxy(request.getfixturevalue(
        "gcs_emulator" if scheme == "gs" else "s3_server"))
    monkeypatch.setattr(cloud_storage, "_clients", {})
    monkeypatch.setattr(cloud_storage, "GCS_RETRY", DEFAULT_RETRY.with_delay(0.01, 0.05))
    monkeypatch.setattr(ExponentialBackoff, "_DEFAULT_BACKOFF_CONFIG", {
        "throttling_base_scale": 0.01, "non_throttling_base_scale": 0.01})
    if scheme == "gs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        storage.configure(storage.Connections())
    else:
        monkeypatch.setenv("AIRFLOW_CONN_S3_PROXIED", json.dumps({
            "conn_type": "aws", "login": S3_KEY_ID, "password": S3_SECRET,
            "extra": {"endpoint_url": proxy.url, "region_name": "us-east-1"}}))
        storage.configure(storage.Connections(aws_conn_id="s3_proxied"))
    yield Proxied(scheme, proxy, f"{scheme}://{BUCKET}/{tmp_path.name}")
    storage.configure(storage.Connections())
    proxy.stop()


def test_transient_faults_are_retried_and_data_arrives_intact(proxied, tmp_path):
    files = make_tree(tmp_path / "src")
    busy = (proxied.error(503, "ServiceUnavailable") if proxied.scheme == "gs"
            else proxied.error(503, "SlowDown"))
    proxied.proxy.fail(proxied.kinds["upload"], **busy, times=3)
    storage.upload_dir(tmp_path / "src", f"{proxied.root}/folder")
    assert proxied.proxy.count(proxied.kinds["upload"]) == len(files) + 3

    proxied.proxy.fail(proxied.kinds["download"], **proxied.error(500, "InternalError"),
                       times=3)
    storage.download_dir(f"{proxied.root}/folder", tmp_path / "back")
    assert read_tree(tmp_path / "back") == files
    assert proxied.proxy.count(proxied.kinds["download"]) == len(files) + 3

    # Server-side copies too (google-cloud-storage retries a rewrite only when asked to).
    proxied.proxy.fail(proxied.kinds["copy"], **busy, times=2)
    assert storage.publish_dir(tmp_path / "src", f"{proxied.root}/v1") is True
    assert proxied.proxy.count(proxied.kinds["copy"]) == len(files) + 2


@pytest.mark.parametrize("proxied", ["s3"], indirect=True)
def test_s3_attempts_follow_the_configured_policy(proxied, tmp_path):
    attempts = cloud_storage.S3_RETRIES["total_max_attempts"]
    assert attempts > 1
    upload = proxied.kinds["upload"]
    (tmp_path / "a.txt").write_bytes(b"alpha\n")
    proxied.proxy.fail(upload, **proxied.error(503, "SlowDown"), times=attempts - 1)
    storage.upload_file(tmp_path / "a.txt", f"{proxied.root}/a.txt")  # the last try passes
    assert proxied.proxy.count(upload) == attempts
    assert storage.read_bytes(f"{proxied.root}/a.txt") == b"alpha\n"

    (tmp_path / "b.txt").write_bytes(b"beta\n")
    proxied.proxy.fail(upload, **proxied.error(500, "InternalError"), times=None)
    with pytest.raises(StorageError, match=rf"{proxied.root}/b\.txt: S3 error InternalError"):
        storage.upload_file(tmp_path / "b.txt", f"{proxied.root}/b.txt")
    assert proxied.proxy.count(upload) == 2 * attempts


@pytest.mark.parametrize("proxied", ["gs"], indirect=True)
def test_gcs_retries_give_up_at_the_policy_timeout(proxied, monkeypatch):
    """GCS retries are bounded by time (the Retry's timeout), not by a count."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    monkeypatch.setattr(cloud_storage, "GCS_RETRY",
                        DEFAULT_RETRY.with_delay(0.01, 0.05).with_timeout(0.5))
    proxied.proxy.fail(proxied.kinds["upload"], **proxied.error(503, "ServiceUnavailable"),
                       times=None)
    started = time.monotonic()
    with pytest.raises(StorageError, match=rf"{proxied.root}/x\.txt: .*503"):
        storage.write_text(f"{proxied.root}/x.txt", "x")
    assert time.monotonic() - started < 5
    assert proxied.proxy.count(proxied.kinds["upload"]) > 2  # retried until the timeout


def test_permanent_errors_are_not_retried_and_name_the_uri(proxied, tmp_path):
    files = make_tree(tmp_path / "src")
    upload, download = proxied.kinds["upload"], proxied.kinds["download"]
    proxied.proxy.fail(upload, **proxied.error(403, "AccessDenied"), times=None)
    with pytest.raises(StorageError, match=rf"{proxied.root}/folder/\S+: access denied"):
        storage.upload_dir(tmp_path / "src", f"{proxied.root}/folder")
    assert proxied.proxy.count(upload) == len(files)  # one try each
    proxied.proxy.clear()

    storage.write_text(f"{proxied.root}/there.txt", "x")
    proxied.proxy.fail(download, **proxied.error(404, "NoSuchKey"))
    with pytest.raises(StorageError, match=rf"{proxied.root}/there\.txt: no such object"):
        storage.read_bytes(f"{proxied.root}/there.txt")
    assert proxied.proxy.count(download) == 1
