"""Run a snippet of Python in a child process that cannot use the network by accident, and see every attempt.

The child has the given variables removed, every proxy pointed at a port nothing answers on (so a download
cannot succeed), and an audit hook that records each socket connection or name lookup it tries; its last output
line is a JSON object, returned with ``attempts`` (the hook's records) added.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing answers
_PRELUDE = textwrap.dedent("""
    import json, sys
    _attempts = []
    def _hook(event, args):
        if event in ("socket.connect", "socket.getaddrinfo"):
            _attempts.append(f"{event} {args[1:]!r}")
    sys.addaudithook(_hook)
    def report(result):
        print(json.dumps({**result, "attempts": _attempts}))
""")


def run_offline(body: str, args: Sequence[str], *, cwd: Path, unset: Collection[str] = (),
                env: Mapping[str, str] | None = None, timeout: float = 120) -> dict[str, Any]:
    """Run ``body`` (which ends by calling ``report(dict)``) with ``args`` as ``sys.argv[1:]``; its report."""
    child_env = {key: value for key, value in os.environ.items()
                 if key not in unset and not key.upper().endswith("_PROXY")}
    child_env.update(HTTPS_PROXY=DEAD_PROXY, HTTP_PROXY=DEAD_PROXY, https_proxy=DEAD_PROXY, http_proxy=DEAD_PROXY,
                     **(env or {}))
    done = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(body), *args], env=child_env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report
