"""A fake IAM API (v1, REST) on loopback for the preflight's service-account check:
`POST /v1/projects/*/serviceAccounts/{email}:testIamPermissions` answers the asked permissions
the caller holds on that account (`grants[email]`), 404 for an account not in `grants`, as
https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts/testIamPermissions
describes. Point the preflight at it with `BERTFLOW_IAM_ENDPOINT`. Requests are kept in
`requests` as (path, body).

It also plays the IAM Service Account Credentials API (`BERTFLOW_IAM_CREDENTIALS_ENDPOINT`):
`POST /v1/projects/-/serviceAccounts/{email}:generateAccessToken` answers the token
`token-for-{email}` when `grants[email]` holds iam.serviceAccounts.getAccessToken, else 403
PERMISSION_DENIED (404 for an unknown account)."""
from __future__ import annotations

import json
import re

from loopback_http import LoopbackServer, QuietHandler

_TEST = re.compile(r"^/v1/projects/[^/]+/serviceAccounts/([^/:]+):testIamPermissions$")
_TOKEN = re.compile(r"^/v1/projects/[^/]+/serviceAccounts/([^/:]+):generateAccessToken$")
GET_TOKEN = "iam.serviceAccounts.getAccessToken"


class FakeIam(LoopbackServer):
    def __init__(self):
        self.grants: dict[str, set[str]] = {}
        self.requests: list[tuple[str, dict]] = []
        fake = self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.body() or b"{}")
                fake.requests.append((self.path, body))
                match = _TEST.match(self.path) or _TOKEN.match(self.path)
                if match and match.re is _TOKEN and match[1] in fake.grants:
                    if GET_TOKEN in fake.grants[match[1]]:
                        code, payload = 200, {"accessToken": f"token-for-{match[1]}",
                                              "expireTime": "2099-01-01T00:00:00Z"}
                    else:
                        code, payload = 403, {"error": {
                            "code": 403, "status": "PERMISSION_DENIED",
                            "message": f"Permission '{GET_TOKEN}' denied on {match[1]}"}}
                elif not match:
                    code, payload = 404, {"error": {"code": 404, "message": "no route",
                                                    "status": "NOT_FOUND"}}
                elif match[1] not in fake.grants:
                    code, payload = 404, {"error": {
                        "code": 404, "status": "NOT_FOUND",
                        "message": f"Unknown service account {match[1]}"}}
                else:
                    held = fake.grants[match[1]]
                    code = 200
                    payload = {"permissions": [p for p in body.get("permissions", [])
                                               if p in held]}
                self.reply_json(code, payload)

        super().__init__(Handler)
