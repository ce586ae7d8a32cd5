"""A fake container registry on loopback speaking the OCI Distribution API's manifest reads
(opencontainers/distribution-spec spec.md: `HEAD /v2/<name>/manifests/<reference>`, 200 or
404 MANIFEST_UNKNOWN) behind Docker's token challenge: a request without a bearer token gets
401 with `WWW-Authenticate: Bearer realm="<base>/token",service="fake",scope="repository:
<name>:pull"`; `GET /token?scope=...` answers a token for a repository in `public`, and for one
in `private` only with basic auth `logins` accepts (else 401). `images` is the set of
"name:reference" that exist. Requests are kept in `requests` as (method, path, auth header).
"""
from __future__ import annotations

import base64
import json
import re
from urllib.parse import parse_qs, urlparse

from loopback_http import LoopbackServer, QuietHandler

_MANIFEST = re.compile(r"^/v2/(.+)/manifests/([^/]+)$")


class FakeRegistry(LoopbackServer):
    def __init__(self):
        self.images: set[str] = set()
        self.public: set[str] = set()
        self.private: set[str] = set()
        self.logins: set[tuple[str, str]] = set()
        self.requests: list[tuple[str, str, str]] = []
        fake = self

        class Handler(QuietHandler):
            def _reply(self, code: int, body: dict | None = None, headers: dict | None = None):
                data = json.dumps(body).encode() if body is not None else b""
                self.reply(code, data, headers=headers, send_body=self.command != "HEAD")

            def _route(self):
                url = urlparse(self.path)
                auth = self.headers.get("Authorization", "")
                fake.requests.append((self.command, url.path, auth))
                if url.path == "/token":
                    scope = parse_qs(url.query).get("scope", [""])[0]
                    name = scope.split(":")[1] if scope.count(":") == 2 else ""
                    login = None
                    if auth.startswith("Basic "):
                        login = tuple(base64.b64decode(auth[6:]).decode().split(":", 1))
                    if name in fake.public or (name in fake.private and login in fake.logins):
                        return self._reply(200, {"token": f"token-for-{name}"})
                    return self._reply(401, {"errors": [{"code": "UNAUTHORIZED"}]})
                match = _MANIFEST.match(url.path)
                if not match:
                    return self._reply(404, {"errors": [{"code": "NAME_UNKNOWN"}]})
                name, reference = match.groups()
                if auth != f"Bearer token-for-{name}":
                    base = f"http://127.0.0.1:{self.server.server_address[1]}"
                    return self._reply(401, {"errors": [{"code": "UNAUTHORIZED"}]}, {
                        "WWW-Authenticate": f'Bearer realm="{base}/token",service="fake",'
                                            f'scope="repository:{name}:pull"'})
                if f"{name}:{reference}" not in fake.images:
                    return self._reply(404, {"errors": [{"code": "MANIFEST_UNKNOWN"}]})
                return self._reply(200, headers={
                    "Docker-Content-Digest": "sha256:" + "0" * 64})

            do_GET = do_HEAD = _route

        super().__init__(Handler)
        self.host = f"127.0.0.1:{self.port}"
