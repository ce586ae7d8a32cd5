"""URIs and file identities, below everything else in `tasks/`: joining URI segments, redacting
credentials out of a URI for messages, the completion manifest (`_COMPLETE.json`) of a
published folder and the file hashes it lists.

Imports nothing of bertflow, so every module (config, storage, the cloud backends, the steps)
can use it without an import circle.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

COMPLETE = "_COMPLETE.json"  # completion manifest of a published folder, written last


def join_uri(base: str, *parts: str) -> str:
    """Join URI/path segments with '/' (works for local paths, gs:// and s3://)."""
    out = base.rstrip("/")
    for p in parts:
        out += "/" + p.strip("/")
    return out


def redact(uri: str) -> str:
    """`uri` without user info or query string, safe to put in logs and error messages."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    netloc, slash, path = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}{slash}{path.split('?', 1)[0]}"


def file_hexdigest(path: Path, algorithm: str = "sha256") -> str:
    """The hex digest of a local file (`hashlib.file_digest`: read in blocks, never the whole
    file in memory)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, algorithm).hexdigest()


def sha256_file(path: Path) -> str:
    return file_hexdigest(path, "sha256")


def completion_manifest(local_dir: Path) -> dict:
    """File list with sizes and sha256 of a folder: the content of `_COMPLETE.json`."""
    root = Path(local_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != COMPLETE)
    return {"files": [{"path": p.relative_to(root).as_posix(), "size": p.stat().st_size,
                       "sha256": sha256_file(p)} for p in files]}


def combined_sha256(files: list[tuple[str, str]]) -> str:
    """Content identity of (uri, sha256) files read in order: the file's sha256, or for
    several files the sha256 of their sha256s in order (independent of where they are)."""
    if len(files) == 1:
        return files[0][1]
    return hashlib.sha256("\n".join(sha for _, sha in files).encode()).hexdigest()
