"""A fake Cloud Quotas API (v1, REST) on loopback: `GET /v1/projects/{p}/locations/global/
services/{service}/quotaInfos` lists `infos[service]` (QuotaInfo dicts) two per page with
`nextPageToken`, as the API pages (Cloud Quotas API reference, quotaInfos.list). `error =
(code, status, message)` makes it fail. Point preflight at it with BERTFLOW_QUOTAS_ENDPOINT.

It also serves Compute Engine's `GET /compute/v1/projects/{p}/regions/{r}` (BERTFLOW_COMPUTE_
ENDPOINT): the region with `quotas` = `regions[(p, r)]` ({metric, limit, usage} dicts), 404
for a region not there. Requests are kept in `requests` as paths."""
from __future__ import annotations

import re
from urllib.parse import parse_qs, urlparse

from loopback_http import LoopbackServer, QuietHandler

_LIST = re.compile(r"^/v1/projects/[^/]+/locations/global/services/([^/]+)/quotaInfos$")
_REGION = re.compile(r"^/compute/v1/projects/([^/]+)/regions/([^/]+)$")


def quota_info(metric: str, values: dict[str, int], default: int | None = None) -> dict:
    """A QuotaInfo of `metric` with a value per region (and one for every other region)."""
    infos = [{"dimensions": {"region": r}, "details": {"value": str(v)},
              "applicableLocations": [r]} for r, v in values.items()]
    if default is not None:
        infos.append({"details": {"value": str(default)}})
    return {"metric": metric, "quotaId": metric.rsplit("/", 1)[-1], "dimensionsInfos": infos,
            "containerType": "PROJECT"}


class FakeQuotas(LoopbackServer):
    def __init__(self):
        self.infos: dict[str, list[dict]] = {}
        self.regions: dict[tuple[str, str], list[dict]] = {}
        self.error: tuple[int, str, str] | None = None
        self.requests: list[str] = []
        fake = self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802
                url = urlparse(self.path)
                fake.requests.append(url.path)
                match = _LIST.match(url.path)
                region = _REGION.match(url.path)
                if region and region.groups() in fake.regions:
                    code, body = 200, {"kind": "compute#region", "name": region[2],
                                       "quotas": fake.regions[region.groups()]}
                elif fake.error or not match:
                    code, status, message = fake.error or (404, "NOT_FOUND", "no route")
                    body = {"error": {"code": code, "status": status, "message": message}}
                else:
                    start = int(parse_qs(url.query).get("pageToken", ["0"])[0])
                    infos = fake.infos.get(match[1], [])
                    code, body = 200, {"quotaInfos": infos[start:start + 2]}
                    if start + 2 < len(infos):
                        body["nextPageToken"] = str(start + 2)
                self.reply_json(code, body)

        super().__init__(Handler)
