"""The real `loopctl proxy`, started for one test on a free loopback port, and the base of the
scripted upstreams it is put in front of."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class ScriptedServer:
    """An HTTP/1.1 server on 127.0.0.1, in a thread, that answers each POST with
    `self.post(request)` (a `BaseHTTPRequestHandler`). `reply` sends a body in pieces with
    `pause` seconds between them."""

    pause = 0.0

    def __init__(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                server.post(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def post(self, request: BaseHTTPRequestHandler):
        raise NotImplementedError

    def reply(self, request: BaseHTTPRequestHandler, pieces: list[str], content_type: str):
        data = [p.encode() for p in pieces]
        request.send_response(200)
        request.send_header("content-type", content_type)
        request.send_header("content-length", str(sum(len(d) for d in data)))
        request.end_headers()
        for i, d in enumerate(data):
            if i:
                time.sleep(self.pause)
            request.wfile.write(d)
            request.wfile.flush()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class Proxy:
    """`loopctl proxy --listen 127.0.0.1:0` in front of `upstream_base`, with `policy` (YAML
    text) written into `directory`; its log goes to `directory/proxy.log`."""

    def __init__(self, loopctl, upstream_base: str, policy: str, directory):
        path = directory / "policy.yaml"
        path.write_text(policy)
        self.stderr = open(directory / "proxy.log", "w+")
        self.child = subprocess.Popen(
            [str(loopctl), "proxy", "--listen", "127.0.0.1:0", "--upstream", upstream_base,
             "--rules", str(path)],
            stdout=subprocess.PIPE, stderr=self.stderr, text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")},
        )
        line = self.child.stdout.readline().strip()
        prefix = "loopctl proxy listening on "
        if not line.startswith(prefix):
            self.close()
            pytest.fail(f"the proxy did not start: {line!r}\n{self.log()}")
        self.base = line[len(prefix):]

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()

    def metrics(self) -> str:
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            return r.read().decode()

    def close(self):
        self.child.kill()
        self.child.wait()
        self.child.stdout.close()
        self.stderr.close()
