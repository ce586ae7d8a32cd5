"""One storage interface over URIs: local paths (or file://), gs:// and s3://.

Every other module reads and writes artifacts through `open_storage(uri)` / the helpers at the
bottom; no other module imports a cloud client. Cloud backends live in `tasks.io.cloud_storage`
and are imported lazily, so local runs never load google-cloud-storage or boto3.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterator, Protocol

from tasks.errors import StorageError
from tasks.io.credentials import Connections
from tasks.io.uris import COMPLETE, completion_manifest, join_uri, redact

# Signed-URL query parameters (S3 SigV2/V4, GCS V2/V4): credentials travelling in a URI.
_SIGNED_PARAMS = re.compile(
    r"[?&](x-amz-(signature|credential|security-token)|x-goog-(signature|credential)|"
    r"signature|awsaccesskeyid|googleaccessid)=", re.IGNORECASE)


def scheme_of(uri: str) -> str:
    """"gs", "s3" or "file". Rejects URIs that embed credentials: those end up in logs, XCom
    and manifests; credentials belong in an Airflow connection or the ambient environment."""
    if "://" in uri and ("@" in uri.split("://", 1)[1].split("/", 1)[0]
                         or _SIGNED_PARAMS.search(uri)):
        raise StorageError(
            f"{redact(uri)}: URIs must not embed credentials (user:password@ or a signed "
            "query string); use an Airflow connection (gcp_conn_id / aws_conn_id) or "
            "ambient credentials")
    if uri.startswith("gs://"):
        return "gs"
    if uri.startswith("s3://"):
        return "s3"
    if "://" in uri and not uri.startswith("file://"):
        raise StorageError(
            f"{redact(uri)}: unsupported URI scheme; use a local path, gs:// or s3://")
    return "file"


def is_local(uri: str) -> bool:
    return scheme_of(uri) == "file"


def local_path(uri: str) -> Path:
    return Path(uri[len("file://"):] if uri.startswith("file://") else uri)


class Storage(Protocol):
    def read_bytes(self, uri: str) -> bytes: ...
    def iter_bytes(self, uri: str, block_size: int, start: int = 0) -> Iterator[bytes]: ...
    def write_bytes(self, uri: str, data: bytes) -> None: ...
    def upload_file(self, path: Path, uri: str) -> None: ...
    def exists(self, uri: str) -> bool: ...
    def list(self, prefix: str) -> list[str]: ...
    def list_sizes(self, prefix: str) -> dict[str, tuple[int, str | None]]: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def upload_dir(self, local_dir: Path, uri: str,
                   names: list[str] | None = None) -> None: ...
    def download_dir(self, uri: str, local_dir: Path,
                     names: list[str] | None = None) -> None: ...
    def publish_dir(self, local_dir: Path, uri: str) -> bool: ...
    def read_versioned(self, uri: str) -> tuple[bytes, str] | None: ...
    def write_if_match(self, uri: str, data: bytes, token: str | None) -> bool: ...


def _into_place(dest: Path, fill) -> None:
    """Write `dest` through `fill(tmp)` on a temporary name beside it, then rename it into
    place: readers never see half a file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp")
    fill(tmp)
    os.replace(tmp, dest)


class LocalStorage:
    """Local filesystem. Writes go to a temporary name first, then are renamed into place."""

    def read_bytes(self, uri: str) -> bytes:
        path = local_path(uri)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise StorageError(f"{uri}: no such file") from None
        except IsADirectoryError:
            raise StorageError(f"{uri}: is a folder, expected a file") from None

    def iter_bytes(self, uri: str, block_size: int, start: int = 0) -> Iterator[bytes]:
        try:
            fh = open(local_path(uri), "rb")
        except FileNotFoundError:
            raise StorageError(f"{uri}: no such file") from None
        except IsADirectoryError:
            raise StorageError(f"{uri}: is a folder, expected a file") from None
        with fh:
            fh.seek(start)
            while block := fh.read(block_size):
                yield block

    def write_bytes(self, uri: str, data: bytes) -> None:
        _into_place(local_path(uri), lambda tmp: tmp.write_bytes(data))

    def upload_file(self, path: Path, uri: str) -> None:
        """Move a local file to `uri` (renamed into place: readers never see half of it)."""
        # a rename on the same file system
        _into_place(local_path(uri), lambda tmp: shutil.move(str(path), tmp))

    def exists(self, uri: str) -> bool:
        return local_path(uri).exists()

    def list(self, prefix: str) -> list[str]:
        root = local_path(prefix)
        if root.is_file():
            return [str(root)]
        if not root.is_dir():
            return []
        return sorted(str(p) for p in root.rglob("*") if p.is_file())

    def list_sizes(self, prefix: str) -> dict[str, tuple[int, str | None]]:
        return {uri: (Path(uri).stat().st_size, None) for uri in self.list(prefix)}

    def delete_prefix(self, prefix: str) -> None:
        path = local_path(prefix)
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()

    def upload_dir(self, local_dir: Path, uri: str, names: list[str] | None = None) -> None:
        dest = local_path(uri)
        if dest.resolve() == Path(local_dir).resolve():
            return
        if names is None:
            shutil.copytree(local_dir, dest, dirs_exist_ok=True)
            return
        for name in names:
            _into_place(dest / name, lambda tmp, n=name: shutil.copyfile(Path(local_dir) / n, tmp))

    def download_dir(self, uri: str, local_dir: Path, names: list[str] | None = None) -> None:
        src = local_path(uri)
        if not src.is_dir():
            raise StorageError(f"{uri}: no such folder")
        if names is None:
            shutil.copytree(src, local_dir, dirs_exist_ok=True)
            return
        for name in names:
            if not (src / name).is_file():
                raise StorageError(f"{uri}/{name}: no such file")
            (Path(local_dir) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, Path(local_dir) / name)

    def publish_dir(self, local_dir: Path, uri: str) -> bool:
        """Copy a folder to `uri` atomically: readers see all of it or nothing.

        Returns False (and changes nothing) if `uri` already exists: complete versions are
        never overwritten. The copy gets a `_COMPLETE.json` like object-store versions do,
        so readers check completeness the same way everywhere.
        """
        dest = local_path(uri)
        if dest.exists():
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.staging")
        shutil.copytree(local_dir, staging)
        (staging / COMPLETE).write_text(json.dumps(completion_manifest(local_dir), indent=2))
        try:
            os.rename(staging, dest)  # atomic on POSIX; fails if dest appeared meanwhile
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if dest.exists():
                return False
            raise
        return True

    def read_versioned(self, uri: str) -> tuple[bytes, str] | None:
        """Content and a token for `write_if_match` (its sha256), or None if missing."""
        try:
            data = local_path(uri).read_bytes()
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def write_if_match(self, uri: str, data: bytes, token: str | None) -> bool:
        """Write only if the content still has `token` (None: only if missing).

        An exclusive lock on a sidecar file (filelock: flock where the file system has it)
        makes check-and-replace atomic between processes and threads on this host; readers
        never lock, they see the old or the new file.
        """
        from filelock import FileLock  # lazy: only promote needs it

        path = local_path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(path.with_name(f".{path.name}.lock")):
            current = self.read_versioned(uri)
            if (current[1] if current else None) != token:
                return False
            self.write_bytes(uri, data)
            return True


_local = LocalStorage()
_connections = Connections()


def configure(connections: Connections) -> None:
    """Set the Airflow connection ids used for cloud URIs in this process."""
    global _connections
    _connections = connections


def open_storage(uri: str) -> Storage:
    scheme = scheme_of(uri)
    if scheme == "file":
        return _local
    from tasks.io import cloud_storage  # lazy: keeps cloud SDKs out of local runs

    return cloud_storage.backend(scheme, _connections)


# --- convenience helpers over any URI -------------------------------------------------------
def read_bytes(uri: str) -> bytes:
    return open_storage(uri).read_bytes(uri)


def iter_bytes(uri: str, block_size: int = 8 << 20, start: int = 0) -> Iterator[bytes]:
    """The object's bytes from byte `start` on, in blocks of at most `block_size`: a
    streaming read (local file reads, ranged GETs on gs:// and s3://), never the whole object
    in memory."""
    return open_storage(uri).iter_bytes(uri, block_size, start)


def upload_file(path: Path, uri: str) -> None:
    """Move the local file `path` to `uri` (a local move, or an upload that is then
    deleted locally); the object appears whole or not at all."""
    open_storage(uri).upload_file(Path(path), uri)


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def write_bytes(uri: str, data: bytes) -> None:
    open_storage(uri).write_bytes(uri, data)


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def read_json(uri: str):
    return json.loads(read_text(uri))


def write_json(uri: str, obj) -> None:
    write_text(uri, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def exists(uri: str) -> bool:
    return open_storage(uri).exists(uri)


def list_uris(prefix: str) -> list[str]:
    return open_storage(prefix).list(prefix)


def list_sizes(prefix: str) -> dict[str, tuple[int, str | None]]:
    """`{uri: (size, md5 hex or None)}` of what `list_uris(prefix)` names, from one listing
    (the object store's MD5 where it has one; None locally and for multipart S3 objects)."""
    return open_storage(prefix).list_sizes(prefix)


def delete_prefix(prefix: str) -> None:
    open_storage(prefix).delete_prefix(prefix)


def upload_dir(local_dir: Path, uri: str, names: list[str] | None = None) -> None:
    """Copy the files of `local_dir` (only `names`, relative paths, if given) under `uri`."""
    open_storage(uri).upload_dir(Path(local_dir), uri, names)


def download_dir(uri: str, local_dir: Path, names: list[str] | None = None) -> None:
    """Copy the files under `uri` (only `names`, relative paths, if given) to `local_dir`."""
    open_storage(uri).download_dir(uri, Path(local_dir), names)


def publish_dir(local_dir: Path, uri: str) -> bool:
    """Publish a folder atomically, with `_COMPLETE.json` last; False if already complete."""
    return open_storage(uri).publish_dir(Path(local_dir), uri)


def is_complete(uri: str) -> bool:
    """Whether `uri` is a fully published folder. Readers trust nothing else."""
    return exists(join_uri(uri, COMPLETE))


def read_versioned(uri: str) -> tuple[bytes, str] | None:
    return open_storage(uri).read_versioned(uri)


def write_if_match(uri: str, data: bytes, token: str | None) -> bool:
    """Compare-and-swap: write if `uri` is unchanged since `read_versioned` gave `token`
    (None: only if it does not exist). False when another writer got there first."""
    return open_storage(uri).write_if_match(uri, data, token)


def glob_uris(pattern: str) -> list[str]:
    """URIs matching `pattern`, where `*` and `?` match within one path segment
    (e.g. `gs://bucket/data/part-*.csv`). A pattern without wildcards matches itself."""
    if is_local(pattern):
        pattern = str(local_path(pattern))
    wild = [i for i, c in enumerate(pattern) if c in "*?"]
    if not wild:
        return [pattern] if pattern in list_uris(pattern) else []
    base = pattern[:wild[0]].rpartition("/")[0]
    regex = re.compile("".join(
        "[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in pattern))
    return [u for u in list_uris(base) if regex.fullmatch(u)]


class staged_local_dir:
    """Context manager giving a local folder for `uri`.

    Local URIs are used in place. Remote ones are downloaded to a temporary folder (mode
    "r") or uploaded from it on exit (mode "w"), for tools that only read local disk.
    """

    def __init__(self, uri: str, mode: str = "r"):
        self.uri, self.mode = uri, mode
        self._tmp: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> Path:
        if is_local(self.uri):
            path = local_path(self.uri)
            if self.mode == "w":
                path.mkdir(parents=True, exist_ok=True)
            return path
        self._tmp = tempfile.TemporaryDirectory(prefix="bertflow-stage-")
        path = Path(self._tmp.name)
        if self.mode == "r":
            download_dir(self.uri, path)
        return path

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._tmp is None:
            return
        try:
            if self.mode == "w" and exc_type is None:
                upload_dir(Path(self._tmp.name), self.uri)
        finally:
            self._tmp.cleanup()
