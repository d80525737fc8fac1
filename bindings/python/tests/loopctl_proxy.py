"""The real `loopctl proxy`, started for one test on a free loopback port in front of a scripted
upstream, with a policy of the test's own."""

from __future__ import annotations

import os
import subprocess
import urllib.request

import pytest


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
