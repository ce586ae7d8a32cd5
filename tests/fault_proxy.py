"""A loopback HTTP proxy that injects faults in front of a real storage server.

The storage clients talk to the proxy as if it were the server, so injected errors arrive
below google-cloud-storage and botocore, where real outages do: the clients' own retry
policies see them. Every request is recorded in `seen` as (Request, status answered).

    proxy = FaultProxy(upstream_url)
    proxy.fail(lambda r: r.method == "PUT", status=503, times=2)  # then pass through
    proxy.count(lambda r: r.method == "PUT")  # attempts seen
"""
from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from loopback_http import LoopbackServer, QuietHandler

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length",
               "proxy-connection", "te", "trailer", "upgrade"}


@dataclass
class Request:
    method: str
    path: str  # with the query string
    headers: dict  # lower-case names


@dataclass
class Fault:
    match: object  # Request -> bool
    status: int
    body: bytes
    content_type: str
    after: int  # matching requests passed through before the faults start
    times: int | None  # faults to answer (None: every matching request from then on)
    matched: int = field(default=0)

    def fires(self, request: Request) -> bool:
        if not self.match(request):
            return False
        self.matched += 1
        n = self.matched - self.after
        return n > 0 and (self.times is None or n <= self.times)


class FaultProxy(LoopbackServer):
    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.faults: list[Fault] = []
        self.seen: list[tuple[Request, int]] = []
        self.lock = threading.Lock()
        super().__init__(_handler(self))
        self.url = self.endpoint
        self.start()

    def fail(self, match, status: int, body: bytes = b"", content_type: str = "text/plain",
             times: int | None = 1, after: int = 0) -> Fault:
        """Answer `status` to matching requests: `times` of them (None: all) after letting
        `after` through."""
        fault = Fault(match, status, body, content_type, after, times)
        with self.lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()

    def count(self, match) -> int:
        """Requests seen (faulted or passed through) that `match(request)`."""
        with self.lock:
            return sum(1 for request, _ in self.seen if match(request))

    def _decide(self, request: Request) -> Fault | None:
        with self.lock:
            return next((f for f in self.faults if f.fires(request)), None)


def _handler(proxy: FaultProxy):
    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and `Expect: 100-continue` as S3 does
        upstream: http.client.HTTPConnection | None = None

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _relay(self):
            body = self._body()
            headers = {k.lower(): v for k, v in self.headers.items()}
            request = Request(self.command, self.path, headers)
            fault = proxy._decide(request)
            if fault is not None:
                status, reply, out = fault.status, fault.body, [
                    ("Content-Type", fault.content_type)]
            else:
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                send = {k: v for k, v in self.headers.items()
                        if k.lower() not in _HOP_BY_HOP and k.lower() != "expect"}
                if body or self.command in ("POST", "PUT", "PATCH"):
                    send["Content-Length"] = str(len(body))
                try:
                    self.upstream.request(self.command, self.path, body=body, headers=send)
                    response = self.upstream.getresponse()
                except (ConnectionError, http.client.HTTPException):
                    self.upstream.close()  # a stale keep-alive connection: once more
                    self.upstream.request(self.command, self.path, body=body, headers=send)
                    response = self.upstream.getresponse()
                status, reply = response.status, response.read()
                out = [(k, v) for k, v in response.getheaders()
                       if k.lower() not in _HOP_BY_HOP]
                if self.command == "HEAD":  # no body, but the object's length
                    out += [("Content-Length", response.getheader("Content-Length", "0"))]
            with proxy.lock:
                proxy.seen.append((request, status))
            self.send_response(status)
            for name, value in out:
                self.send_header(name, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
            else:
                self.end_headers()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _relay

    return Handler
