"""gs:// and s3:// backends of `tasks.io.storage.Storage` (google-cloud-storage and boto3).

`ObjectStore` holds the logic both share (folders, checksummed sync, atomic publish);
`GCSStore` and `S3Store` only map a handful of object primitives onto each SDK. Imported
lazily by `tasks.io.storage` for cloud URIs only.

Retries and concurrency are the clients' own; this module has no retry loop. Every GCS call
gets google-api-core's `Retry` (`GCS_RETRY`), the S3 client botocore's standard retry mode
(`S3_RETRIES`); folder transfers go through google-cloud-storage's `transfer_manager`
(threads) and boto3's managed transfer (s3transfer), which also checksum what they move.

Credentials come from the Airflow connection named in `Connections` (read through
`airflow.sdk`, imported only when a connection id is set) or from the ambient environment
(ADC for Google, the boto3 chain for AWS). Endpoints are overridable for emulators:
`STORAGE_EMULATOR_HOST` or an `endpoint_url`/`api_endpoint` extra for GCS, `AWS_ENDPOINT_URL`
or an `endpoint_url` extra for S3. Secrets never enter messages: errors name the URI only.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import uuid
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from tasks.errors import StorageError
from tasks.io.credentials import Connections
from tasks.io.uris import COMPLETE, completion_manifest, file_hexdigest, redact

# Concurrent object transfers per folder operation. transfer_manager's default of 8 was
# slower than 4 against the loopback emulators on 2 cores (a one-off run; no results file).
WORKERS = 4

# None: google-cloud-storage's DEFAULT_RETRY, which retries 408, 429, 5xx and connection
# errors with a backoff from 1 s doubling to 60 s, for at most 120 s per call. Read when a
# client is built; tests shorten the backoff.
GCS_RETRY = None
# botocore's standard mode: at most 5 attempts per request after 5xx, throttling, timeouts and
# connection errors, jittered backoff from 50 ms (1 s when throttled) doubling to 20 s, and a
# per-client retry budget that stops retrying in a wide outage. (Config's `max_attempts`
# would count retries only: 5 meant 6 attempts.)
S3_RETRIES = {"mode": "standard", "total_max_attempts": 5}

_clients: dict[tuple, "ObjectStore"] = {}
_clients_lock = threading.Lock()


def backend(scheme: str, connections: Connections) -> "ObjectStore":
    """The store for `scheme` ("gs" or "s3"), built once per connection and endpoint."""
    conn_id = connections.gcp_conn_id if scheme == "gs" else connections.aws_conn_id
    env = tuple(os.environ.get(k) for k in (
        "STORAGE_EMULATOR_HOST", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"))
    key = (scheme, conn_id, env)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = GCSStore(conn_id) if scheme == "gs" else S3Store(conn_id)
        return _clients[key]


def split(uri: str) -> tuple[str, str]:
    """gs://bucket/a/b -> ("bucket", "a/b")."""
    bucket, _, key = uri.split("://", 1)[1].partition("/")
    if not bucket:
        raise StorageError(f"{redact(uri)}: no bucket name")
    return bucket, key


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _airflow_connection(conn_id: str):
    # Lazy: airflow is heavy and absent from worker images that only train.
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise StorageError(f"Airflow connection '{conn_id}' is not defined; create it or "
                           "clear the conn id to use ambient credentials") from None


def google_connection(conn_id: str) -> tuple:
    """(credentials or None, project or None, endpoint or None) of a Google Cloud Airflow
    connection: a key (keyfile_dict or key_path extra) gives service-account credentials,
    no key means ambient ones (None). Shared by GCS and the Vertex AI backend."""
    extra = _airflow_connection(conn_id).extra_dejson
    get = lambda name: extra.get(name) or extra.get(  # noqa: E731
        f"extra__google_cloud_platform__{name}")
    credentials = None
    keyfile = get("keyfile_dict")
    if keyfile or get("key_path"):
        from google.oauth2 import service_account

        credentials = (
            service_account.Credentials.from_service_account_info(
                json.loads(keyfile) if isinstance(keyfile, str) else keyfile)
            if keyfile else
            service_account.Credentials.from_service_account_file(get("key_path")))
    return (credentials, get("project") or get("project_id") or None,
            get("endpoint_url") or get("api_endpoint") or None)


def aws_connection(conn_id: str) -> dict:
    """boto3 client arguments of an AWS Airflow connection (keys, session token, region,
    endpoint_url), the ones set. Shared by S3 and preflight's IAM and ECR calls."""
    conn = _airflow_connection(conn_id)
    extra = conn.extra_dejson
    found = {"aws_access_key_id": conn.login or extra.get("aws_access_key_id"),
             "aws_secret_access_key": conn.password or extra.get("aws_secret_access_key"),
             "aws_session_token": extra.get("aws_session_token"),
             "region_name": extra.get("region_name"),
             "endpoint_url": extra.get("endpoint_url")}
    return {k: v for k, v in found.items() if v}


class ObjectStore(ABC):
    """Storage over a flat object namespace. A "folder" `uri` is the objects under `uri/`."""

    scheme = ""

    # --- primitives, one SDK call (or one client transfer manager) each; keys are object
    # names within `bucket`; errors of batch primitives name the object -------------------
    @abstractmethod
    def _get(self, bucket: str, key: str) -> bytes: ...
    @abstractmethod
    def _iter_blocks(self, bucket: str, key: str, block_size: int, start: int): ...
    @abstractmethod
    def _put(self, bucket: str, key: str, data: bytes) -> None: ...
    @abstractmethod
    def _put_files(self, bucket: str, pairs: list[tuple[Path, str]]) -> None:
        """Upload (local path, key) pairs concurrently; the server checks each checksum."""
    @abstractmethod
    def _get_files(self, bucket: str, pairs: list[tuple[str, Path]], known: dict) -> None:
        """Download (key, local path) pairs concurrently, verifying checksums. `known` is
        `_list`'s answer for the keys, so that a client need not ask again."""
    @abstractmethod
    def _copy_many(self, bucket: str, pairs: list[tuple[str, str]], known: dict) -> None:
        """Server-side copies of (source key, destination key) pairs; `known` as above."""
    @abstractmethod
    def _list(self, bucket: str, prefix: str,
              limit: int | None = None) -> dict[str, tuple[int, str | None]]:
        """{key: (size, md5 hex or None)} of the first `limit` (default: all) objects whose
        name starts with prefix, in name order."""
    @abstractmethod
    def _delete(self, bucket: str, keys: list[str]) -> None: ...
    @abstractmethod
    def _get_versioned(self, bucket: str, key: str) -> tuple[bytes, str] | None: ...
    @abstractmethod
    def _put_if(self, bucket: str, key: str, data: bytes, token: str | None) -> bool:
        """Write if the object's version token is `token` (None: if it does not exist)."""
    @abstractmethod
    def _errors(self, uri: str):
        """Context manager turning SDK exceptions into StorageErrors that name `uri`."""

    # --- Storage protocol -----------------------------------------------------------------
    def read_bytes(self, uri: str) -> bytes:
        bucket, key = split(uri)
        with self._errors(uri):
            return self._get(bucket, key)

    def iter_bytes(self, uri: str, block_size: int, start: int = 0):
        """Streaming read from byte `start`: ranged GETs of `block_size` bytes (each retried
        by the client)."""
        bucket, key = split(uri)
        with self._errors(uri):
            yield from self._iter_blocks(bucket, key, block_size, start)

    def write_bytes(self, uri: str, data: bytes) -> None:
        bucket, key = split(uri)
        with self._errors(uri):
            self._put(bucket, key, data)

    def upload_file(self, path: Path, uri: str) -> None:
        bucket, key = split(uri)
        self._put_files(bucket, [(Path(path), key)])
        Path(path).unlink()

    def exists(self, uri: str) -> bool:
        bucket, key = split(uri)
        with self._errors(uri):
            # An object named `key` sorts before anything else that starts with it.
            return bool(key and key in self._list(bucket, key, limit=1)
                        or self._list(bucket, _folder(key), limit=1))

    def list(self, prefix: str) -> list[str]:
        """The object `prefix` if it exists, else the objects in folder `prefix/` (as local
        storage does for a file or a folder)."""
        return [self._uri(bucket, k) for bucket, k in self._folder_keys(prefix)]

    def list_sizes(self, prefix: str) -> dict[str, tuple[int, str | None]]:
        bucket, found = self._folder_listing(prefix)
        return {self._uri(bucket, k): found[k] for k in sorted(found)}

    def delete_prefix(self, prefix: str) -> None:
        keys = self._folder_keys(prefix)
        if keys:
            with self._errors(prefix):
                self._delete(keys[0][0], [k for _, k in keys])

    def upload_dir(self, local_dir: Path, uri: str, names: list[str] | None = None) -> None:
        root = Path(local_dir)
        bucket, key = split(uri)
        files = ([root / n for n in names] if names is not None
                 else [p for p in sorted(root.rglob("*")) if p.is_file()])
        self._put_files(bucket, [(p, _join(key, p.relative_to(root).as_posix()))
                                 for p in files])

    def download_dir(self, uri: str, local_dir: Path, names: list[str] | None = None) -> None:
        bucket, key = split(uri)
        folder = _folder(key)
        with self._errors(uri):
            found = self._list(bucket, folder)
        if not found:
            raise StorageError(f"{redact(uri)}: no such folder")
        if names is not None:
            missing = [n for n in names if folder + n not in found]
            if missing:
                raise StorageError(f"{redact(uri)}/{missing[0]}: no such object")
            found = {folder + n: found[folder + n] for n in names}
        pairs = [(k, Path(local_dir) / k[len(folder):]) for k in sorted(found)]
        for _, dest in pairs:
            dest.parent.mkdir(parents=True, exist_ok=True)
        self._get_files(bucket, pairs, found)

    def publish_dir(self, local_dir: Path, uri: str) -> bool:
        """Publish a folder so readers see all of it or nothing.

        Objects go to a staging prefix of this attempt (`{parent}/.staging/{name}.{id}/`), are
        verified (sizes and MD5 against the local files), copied server-side into `uri/`,
        verified again, and `_COMPLETE.json` (files, sizes, sha256) is written last with a
        create-only precondition. A retry after an interruption sends only the files not
        already in place and completes the version. Returns False if `uri` is already
        complete, leaving it untouched. Concurrent publishers of one `uri` must publish the
        same content (as content-addressed caches do); run versions each have their own uri.
        """
        bucket, key = split(uri)
        complete_key = _join(key, COMPLETE)
        final = _folder(key)
        with self._errors(uri):
            if complete_key in self._list(bucket, complete_key):
                return False
            in_place = self._list(bucket, final)
        root = Path(local_dir)
        manifest = completion_manifest(root)
        want = {f["path"]: (f["size"], file_hexdigest(root / f["path"], "md5"))
                for f in manifest["files"]}
        parent, _, name = key.rstrip("/").rpartition("/")
        staging = _folder(_join(parent, ".staging", f"{name}.{uuid.uuid4().hex[:12]}"))
        try:
            self._sync(uri, bucket, staging, {
                rel: v for rel, v in want.items() if not _matches(in_place.get(final + rel), *v)
            }, lambda rels: self._put_files(bucket, [(root / r, staging + r) for r in rels]))
            self._sync(uri, bucket, final, want, lambda rels: self._copy_many(
                bucket, [(staging + r, final + r) for r in rels],
                {staging + r: want[r] for r in rels}))
            body = json.dumps(manifest, indent=2, sort_keys=True).encode()
            with self._errors(uri):
                return self._put_if(bucket, complete_key, body, None)
        finally:
            with self._errors(uri):
                self._delete(bucket, list(self._list(bucket, staging)))

    def read_versioned(self, uri: str) -> tuple[bytes, str] | None:
        bucket, key = split(uri)
        with self._errors(uri):
            return self._get_versioned(bucket, key)

    def write_if_match(self, uri: str, data: bytes, token: str | None) -> bool:
        bucket, key = split(uri)
        with self._errors(uri):
            return self._put_if(bucket, key, data, token)

    # --- shared machinery -----------------------------------------------------------------
    def _uri(self, bucket: str, key: str) -> str:
        return f"{self.scheme}://{bucket}/{key}"

    def _folder_keys(self, prefix: str) -> list[tuple[str, str]]:
        bucket, found = self._folder_listing(prefix)
        return [(bucket, k) for k in sorted(found)]

    def _folder_listing(self, prefix: str) -> tuple[str, dict[str, tuple[int, str | None]]]:
        """The object `prefix` if it exists, else the objects in folder `prefix/`."""
        bucket, key = split(prefix)
        with self._errors(prefix):
            found = self._list(bucket, key, limit=1) if key else {}
            if key not in found:
                found = self._list(bucket, _folder(key))
        return bucket, found

    def _sync(self, uri: str, bucket: str, prefix: str, want: dict, send) -> None:
        """Make the objects under `prefix` exactly `want` ({relpath: (size, md5)}): send the
        missing or different ones (`send(relpaths)`), delete strays from an earlier attempt,
        then verify."""
        with self._errors(uri):
            have = self._list(bucket, prefix)
        todo = [rel for rel, (size, md5) in want.items()
                if not _matches(have.get(prefix + rel), size, md5)]
        if todo:
            send(todo)
        with self._errors(uri):
            strays = [k for k in have if k[len(prefix):] not in want]
            if strays:
                self._delete(bucket, strays)
            have = self._list(bucket, prefix)
        bad = [rel for rel, (size, md5) in want.items()
               if not _matches(have.get(prefix + rel), size, md5)]
        if bad:
            raise StorageError(f"{redact(uri)}: verification failed after upload for "
                               f"{', '.join(bad[:5])} (size or checksum differs)")

    def _raise_first(self, bucket: str, keys: list[str], outcomes) -> None:
        """Raise the first exception among `outcomes` (one per key) naming its object."""
        for key, outcome in zip(keys, outcomes):
            if isinstance(outcome, Exception):
                with self._errors(self._uri(bucket, key)):
                    raise outcome


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def _folder(key: str) -> str:
    """Prefix of the objects "inside" `key`; the whole bucket for an empty key."""
    return key.rstrip("/") + "/" if key.strip("/") else ""


def _matches(found: tuple[int, str | None] | None, size: int, md5: str) -> bool:
    # Objects without an MD5 (composite/multipart) are checked by size only: the server
    # checked each part's checksum when it arrived.
    return found is not None and found[0] == size and found[1] in (None, md5)


# --- Google Cloud Storage ------------------------------------------------------------------
class GCSStore(ObjectStore):
    scheme = "gs"

    def __init__(self, conn_id: str):
        from google.cloud import storage as gcs
        from google.cloud.storage.retry import DEFAULT_RETRY

        kwargs: dict = {}
        if conn_id:
            credentials, project, endpoint = google_connection(conn_id)
            if credentials is not None:
                kwargs["credentials"] = credentials
            if endpoint:
                kwargs["client_options"] = {"api_endpoint": endpoint}
                # An endpoint without a key is an emulator: talk to it anonymously.
                kwargs["use_auth_w_custom_endpoint"] = "credentials" in kwargs
            kwargs["project"] = project
        try:
            self.client = gcs.Client(**kwargs)
        except Exception as err:  # google.auth.exceptions.DefaultCredentialsError
            raise StorageError(f"gs://: cannot create a Google Cloud Storage client "
                               f"({type(err).__name__}); set gcp_conn_id or configure "
                               "application-default credentials") from None
        # Passed to every call, also where the library's default is conditional (rewrite):
        # all our writes are idempotent (same bytes to the same name) or preconditioned.
        self.retry = GCS_RETRY or DEFAULT_RETRY

    def _blob(self, bucket: str, key: str):
        return self.client.bucket(bucket).blob(key)

    def _get(self, bucket, key):
        return self._blob(bucket, key).download_as_bytes(checksum="md5", retry=self.retry)

    def _iter_blocks(self, bucket, key, block_size, start):
        # google-cloud-storage's BlobReader: ranged downloads pinned to the object's
        # generation, each retried by the client.
        with self._blob(bucket, key).open("rb", chunk_size=block_size,
                                          retry=self.retry) as reader:
            reader.seek(start)
            while block := reader.read(block_size):
                yield block

    def _put(self, bucket, key, data):
        self._blob(bucket, key).upload_from_string(data, checksum="crc32c", retry=self.retry)

    def _put_files(self, bucket, pairs):
        # The client sends a CRC32C the server checks (the client checks it for resumable
        # uploads, over 8 MiB); `_sync` then compares the MD5s the server lists.
        from google.cloud.storage import transfer_manager

        results = transfer_manager.upload_many(
            [(str(path), self._blob(bucket, key)) for path, key in pairs],
            upload_kwargs={"checksum": "crc32c", "retry": self.retry},
            worker_type=transfer_manager.THREAD, max_workers=WORKERS)
        self._raise_first(bucket, [key for _, key in pairs], results)

    def _get_files(self, bucket, pairs, known):
        from google.cloud.storage import transfer_manager

        results = transfer_manager.download_many(
            [(self._blob(bucket, key), str(path)) for key, path in pairs],
            download_kwargs={"checksum": "md5", "retry": self.retry},
            worker_type=transfer_manager.THREAD, max_workers=WORKERS)
        self._raise_first(bucket, [key for key, _ in pairs], results)

    def _copy_many(self, bucket, pairs, known):
        def copy(pair: tuple[str, str]) -> None:
            source, target = self._blob(bucket, pair[0]), self._blob(bucket, pair[1])
            token, _, _ = target.rewrite(source, retry=self.retry)
            while token:  # large objects are rewritten in several calls
                token, _, _ = target.rewrite(source, token=token, retry=self.retry)

        self._raise_first(bucket, [dst for _, dst in pairs], _each(copy, pairs))

    def _list(self, bucket, prefix, limit=None):
        return {b.name: (b.size, _b64_to_hex(b.md5_hash) if b.md5_hash else None)
                for b in self.client.list_blobs(bucket, prefix=prefix, max_results=limit,
                                                retry=self.retry)}

    def _delete(self, bucket, keys):
        from google.api_core.exceptions import NotFound

        def delete(key: str) -> None:
            try:
                self._blob(bucket, key).delete(retry=self.retry)
            except NotFound:  # also a retried delete whose first try went through
                pass

        self._raise_first(bucket, keys, _each(delete, keys))

    def _get_versioned(self, bucket, key):
        blob = self.client.bucket(bucket).get_blob(key, retry=self.retry)
        if blob is None:
            return None
        generation = blob.generation  # read first: a download refreshes it from headers
        return (blob.download_as_bytes(if_generation_match=generation, retry=self.retry),
                str(generation))

    def _put_if(self, bucket, key, data, token):
        # Retried like any write: a retry whose first try went through gets 412 and returns
        # False, and callers re-read (promote then finds its own record, publish a complete
        # version), so the ambiguity is harmless.
        from google.api_core.exceptions import PreconditionFailed

        try:  # generation 0 means "must not exist"
            self._blob(bucket, key).upload_from_string(
                data, if_generation_match=int(token) if token else 0, retry=self.retry)
        except PreconditionFailed:
            return False
        return True

    @contextmanager
    def _errors(self, uri):
        from google.api_core import exceptions as gexc

        try:
            yield
        except StorageError:
            raise
        except gexc.NotFound:
            bucket = split(uri)[0]
            if not self.client.bucket(bucket).exists(retry=self.retry):
                raise StorageError(f"{redact(uri)}: bucket '{bucket}' does not exist") from None
            raise StorageError(f"{redact(uri)}: no such object") from None
        except (gexc.Forbidden, gexc.Unauthorized) as err:
            raise StorageError(f"{redact(uri)}: access denied ({err.code}); check the "
                               "credentials of gcp_conn_id or the ambient account") from None
        except Exception as err:
            raise StorageError(f"{redact(uri)}: {type(err).__name__}: {err}") from err


def _each(fn, items: list) -> list:
    """fn(item) for every item on WORKERS threads: each item's exception or None, in order.
    For GCS rewrites and deletes, which google-cloud-storage's transfer_manager lacks."""
    def run(item):
        try:
            fn(item)
        except Exception as err:  # noqa: BLE001 - raised by the caller, naming the object
            return err

    with ThreadPoolExecutor(min(WORKERS, len(items) or 1)) as pool:
        return list(pool.map(run, items))


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


# --- Amazon S3 -----------------------------------------------------------------------------
class S3Store(ObjectStore):
    scheme = "s3"

    def __init__(self, conn_id: str):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        kwargs = aws_connection(conn_id) if conn_id else {}
        session = boto3.session.Session()
        kwargs["region_name"] = kwargs.get("region_name") or session.region_name or "us-east-1"
        self.client = session.client(
            "s3", config=Config(retries=dict(S3_RETRIES), max_pool_connections=2 * WORKERS),
            **{k: v for k, v in kwargs.items() if v})
        # Multipart from 100 MiB, where AWS advises it, not s3transfer's 8 MiB: below that a
        # single PUT keeps the MD5 ETag `_sync` verifies and a whole-object GET whose CRC32
        # botocore checks, and multipart made the export-like folder slower (one-off, no results
        # file).
        self.transfer = TransferConfig(max_concurrency=WORKERS, multipart_threshold=100 << 20)

    def _get(self, bucket, key):
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def _iter_blocks(self, bucket, key, block_size, start):
        # Ranged GETs pinned to the object's ETag (a change mid-read fails instead of mixing
        # two versions).
        head = self.client.head_object(Bucket=bucket, Key=key)
        size, etag = head["ContentLength"], head["ETag"]
        for first in range(start, size, block_size):
            end = min(size, first + block_size) - 1
            yield self.client.get_object(Bucket=bucket, Key=key, Range=f"bytes={first}-{end}",
                                         IfMatch=etag)["Body"].read()

    def _put(self, bucket, key, data):
        self.client.put_object(Bucket=bucket, Key=key, Body=data,
                               ContentMD5=_hex_to_b64(_md5(data)))

    def _transfer(self, bucket: str, jobs: list) -> None:
        """Run (key, submit(manager)) jobs on one s3transfer manager; raise the first
        failure naming its object once all have finished."""
        from boto3.s3.transfer import create_transfer_manager

        with create_transfer_manager(self.client, self.transfer) as manager:
            futures = [(key, submit(manager)) for key, submit in jobs]
        for key, future in futures:
            with self._errors(self._uri(bucket, key)):
                future.result()

    def _put_files(self, bucket, pairs):
        self._transfer(bucket, [(key, lambda m, p=str(path), k=key: m.upload(p, bucket, k))
                                for path, key in pairs])

    def _get_files(self, bucket, pairs, known):
        self._transfer(bucket, [(key, lambda m, k=key, p=str(path): m.download(
            bucket, k, p, subscribers=[_Known(*known[k])])) for key, path in pairs])

    def _copy_many(self, bucket, pairs, known):
        # Managed copies: CopyObject, or UploadPartCopy above the multipart threshold (a
        # single CopyObject fails above 5 GB).
        self._transfer(bucket, [(dst, lambda m, s=src, d=dst: m.copy(
            {"Bucket": bucket, "Key": s}, bucket, d, subscribers=[_Known(*known[s])]))
            for src, dst in pairs])

    def _list(self, bucket, prefix, limit=None):
        found = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix, PaginationConfig={"MaxItems": limit}):
            for obj in page.get("Contents", []):
                etag = obj["ETag"].strip('"')
                found[obj["Key"]] = (obj["Size"], None if "-" in etag else etag)
        return found

    def _delete(self, bucket, keys):
        for start in range(0, len(keys), 1000):  # DeleteObjects takes 1000 keys per call
            self.client.delete_objects(Bucket=bucket, Delete={
                "Objects": [{"Key": k} for k in keys[start:start + 1000]], "Quiet": True})

    def _get_versioned(self, bucket, key):
        try:
            response = self.client.get_object(Bucket=bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            return None
        return response["Body"].read(), response["ETag"]

    def _put_if(self, bucket, key, data, token):
        # Retried by botocore; a retry whose first try went through returns False (see GCS).
        from botocore.exceptions import ClientError

        condition = {"IfMatch": token} if token else {"IfNoneMatch": "*"}
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=data, **condition)
        except ClientError as err:
            if err.response["Error"]["Code"] in ("PreconditionFailed",
                                                 "ConditionalRequestConflict"):
                return False
            raise
        return True

    @contextmanager
    def _errors(self, uri):
        from botocore.exceptions import ClientError, NoCredentialsError

        try:
            yield
        except StorageError:
            raise
        except NoCredentialsError:
            raise StorageError(f"{redact(uri)}: no AWS credentials; set aws_conn_id or the "
                               "ambient AWS credentials") from None
        except ClientError as err:
            code = err.response["Error"]["Code"]
            bucket = split(uri)[0]
            if code == "NoSuchBucket":
                raise StorageError(f"{redact(uri)}: bucket '{bucket}' does not exist") from None
            if code in ("NoSuchKey", "404"):
                raise StorageError(f"{redact(uri)}: no such object") from None
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                        "AllAccessDisabled"):
                raise StorageError(f"{redact(uri)}: access denied ({code}); check the "
                                   "credentials of aws_conn_id or the ambient AWS "
                                   "credentials") from None
            raise StorageError(f"{redact(uri)}: S3 error {code}") from None
        except Exception as err:
            raise StorageError(f"{redact(uri)}: {type(err).__name__}: {err}") from err


class _Known:
    """s3transfer subscriber passing on what the listing said: with the size (and the ETag
    of a single-part object, its MD5) a download or copy skips its HeadObject, which
    otherwise doubles the requests for small files."""

    def __init__(self, size: int, md5: str | None):
        self.size, self.md5 = size, md5

    def on_queued(self, future, **kwargs):
        future.meta.provide_transfer_size(self.size)
        if self.md5:
            future.meta.provide_object_etag(f'"{self.md5}"')


def _hex_to_b64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode()
