"""A small fake Hugging Face Hub on loopback, for the real `huggingface_hub` client (via
HF_ENDPOINT or its `endpoint=` argument): enough of the API that `model_info` and
`snapshot_download` use, nothing more.

- `GET /api/models/{repo}[/revision/{rev}]`: `{"id", "sha", "siblings": [{"rfilename", "size",
  "blobId", "lfs": {"size", "sha256", "pointerSize"}}], "gated", "private"}` (files_metadata
  form, hf_api.ModelInfo).
- `GET /api/models/{repo}/tree/{rev}`: the commit's files, `[{"type": "file", "path", "size",
  "oid", "lfs": {"oid", "size", "pointerSize"}}]` (hf_api.RepoFile), one page; what
  `snapshot_download` lists since huggingface_hub 1.x.
- `HEAD|GET /{repo}/resolve/{rev}/{file}`: the bytes with `X-Repo-Commit`, `ETag`,
  `X-Linked-Etag` and `X-Linked-Size` (LFS files), `Content-Length`; the headers
  file_download.get_hf_file_metadata reads.
- Errors as the Hub sends them (utils/_http.hf_raise_for_status keys on `X-Error-Code`): 401
  RepoNotFound for an unknown repo (the Hub answers 401 to anonymous callers), 404
  RevisionNotFound, 404 EntryNotFound, 401 GatedRepo for a gated repo's files without a token
  (its metadata stays public, as on the Hub), 403 GatedRepo with a token without access.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from loopback_http import LoopbackServer, QuietHandler

LFS_SUFFIXES = (".safetensors", ".h5", ".bin")


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> files
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> sha
    gated: bool = False
    allowed_tokens: set[str] = field(default_factory=set)

    def commit_of(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


class FakeHub(LoopbackServer):
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, auth)
        super().__init__(_handler(self))

    def add(self, repo_id: str, folder: Path, ref: str = "main", gated: bool = False,
            tokens: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> str:
        """Commit the files of `folder` (but `skip`) as `ref` of `repo_id`; the commit sha."""
        files = {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())
                 if p.is_file() and p.name not in skip}
        sha = hashlib.sha1(repr(sorted((k, hashlib.sha256(v).hexdigest())
                                       for k, v in files.items())).encode()
                           + ref.encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, Repo())
        repo.commits[sha] = files
        repo.refs[ref] = sha
        repo.gated = repo.gated or gated
        repo.allowed_tokens.update(tokens)
        return sha

    def file_gets(self, name: str) -> int:
        return sum(1 for method, path, _ in self.requests
                   if method == "GET" and "/resolve/" in path and path.endswith("/" + name))


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's object id


def _handler(hub: FakeHub):
    class Handler(QuietHandler):
        def do_GET(self):
            self._serve(body=True)

        def do_HEAD(self):
            self._serve(body=False)

        def _fail(self, status: int, code: str, message: str):
            self.reply_json(status, {"error": message}, send_body=self.command == "GET",
                            headers={"X-Error-Code": code, "X-Error-Message": message})

        def _serve(self, body: bool):
            path = unquote(urlsplit(self.path).path)
            auth = self.headers.get("Authorization")
            hub.requests.append((self.command, path, auth))
            token = auth.split(" ", 1)[1] if auth and auth.startswith("Bearer ") else None
            if path.startswith("/api/models/"):
                rest = path[len("/api/models/"):]
                if "/tree/" in rest:
                    repo_id, _, revision = rest.partition("/tree/")
                    return self._tree(repo_id, revision)
                repo_id, _, revision = rest.partition("/revision/")
                return self._info(repo_id, revision or "main")
            if "/resolve/" in path:
                repo_id, _, rest = path.lstrip("/").partition("/resolve/")
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._fail(401, "RepoNotFound", "Repository not found")
                # The revision may hold slashes (refs/pr/1); the file name has none here.
                revision, _, name = rest.rpartition("/")
                if repo.gated and token not in repo.allowed_tokens:
                    status = 401 if token is None else 403
                    return self._fail(status, "GatedRepo",
                                      f"Access to model {repo_id} is restricted.")
                return self._file(repo, revision, name, body)
            self._fail(404, "NotFound", f"no route {path}")

        def _commit(self, repo_id: str, revision: str) -> tuple[Repo, str] | None:
            """The repo and the commit `revision` names; None after answering an error."""
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._fail(401, "RepoNotFound", "Repository not found")
            sha = repo.commit_of(revision)
            if sha is None:
                return self._fail(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return repo, sha

        def _tree(self, repo_id: str, revision: str):
            found = self._commit(repo_id, revision)
            if found is None:
                return
            repo, sha = found
            entries = []
            for name, data in repo.commits[sha].items():
                entry = {"type": "file", "path": name, "size": len(data), "oid": _blob_id(data)}
                if name.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                    "pointerSize": 134}
                entries.append(entry)
            self._json(entries)

        def _info(self, repo_id: str, revision: str):
            found = self._commit(repo_id, revision)
            if found is None:
                return
            repo, sha = found
            siblings = []
            for name, data in repo.commits[sha].items():
                entry = {"rfilename": name, "size": len(data), "blobId": _blob_id(data)}
                if name.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"size": len(data), "pointerSize": 134,
                                    "sha256": hashlib.sha256(data).hexdigest()}
                siblings.append(entry)
            self._json({"id": repo_id, "modelId": repo_id, "sha": sha, "siblings": siblings,
                        "gated": "manual" if repo.gated else False, "private": False,
                        "disabled": False, "tags": [], "downloads": 0, "likes": 0})

        def _file(self, repo: Repo, revision: str, name: str, body: bool):
            sha = repo.commit_of(revision)
            if sha is None:
                return self._fail(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            data = repo.commits[sha].get(name)
            if data is None:
                return self._fail(404, "EntryNotFound", f"{name} does not exist")
            etag = (hashlib.sha256(data).hexdigest() if name.endswith(LFS_SUFFIXES)
                    else _blob_id(data))
            headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"'}
            if name.endswith(LFS_SUFFIXES):
                headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
            self.reply(200, data, "application/octet-stream", headers, send_body=body)

        def _json(self, obj):
            self.reply_json(200, obj, send_body=self.command == "GET")

    return Handler
