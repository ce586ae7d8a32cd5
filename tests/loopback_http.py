"""What the tests' fake servers share: a threaded HTTP server on a free loopback port, and a
request handler that logs nothing and replies in one call. Each fake keeps only its routes
and its state."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # pytest would print every request
        pass

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, code: int, data: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None, send_body: bool = True) -> None:
        """Status, headers and `data` with its length (`send_body` False: a HEAD's answer)."""
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if send_body:
            self.wfile.write(data)

    def reply_json(self, code: int, payload, **kwargs) -> None:
        self.reply(code, json.dumps(payload).encode(), **kwargs)


class LoopbackServer:
    """`handler` served on 127.0.0.1 at a free port, from a daemon thread once started. A fake
    subclasses it and calls `super().__init__(Handler)` once its state is set."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                        daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
