"""Run one CAS transfer in a process of its own and report its memory: ``python -m tests.support.s3_transfer_probe
SETTINGS_JSON put FILE`` or ``… get HASH OUT``. Prints one JSON line: the hash, the seconds the transfer took,
and the process's peak RSS before the transfer (imports, client, a first request) and after it, in bytes.

A process of its own, so that its peak RSS is the transfer's and nothing else's. The peak is the kernel's
``VmHWM`` (this process's own high-water mark), not ``ru_maxrss``, which a child inherits from the process
that forked it (pytest's, larger than the transfer's).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from shardfuse.pipeline.config.handoff import read_settings_file
from shardfuse.pipeline.storage.opening import open_content_store


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # in kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(argv: list[str]) -> int:
    settings_file, op, *rest = argv
    store = open_content_store(read_settings_file(Path(settings_file)))
    store.exists("sha256:" + "0" * 64)  # imports done, client built, connection open: the baseline
    baseline = peak_rss_bytes()
    started = time.perf_counter()
    if op == "put":
        content_hash, size = store.put_file(Path(rest[0]))
    else:
        content_hash = rest[0]
        with open(rest[1], "wb") as out:
            size = store.copy_to(content_hash, out)
    seconds = time.perf_counter() - started
    print(json.dumps({"hash": content_hash, "size": size, "seconds": round(seconds, 3), "baseline_rss": baseline,
                      "peak_rss": peak_rss_bytes()}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
