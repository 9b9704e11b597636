"""embedder.cache: the chunk embedding cache is asked unless the embedder makes vectors faster than it answers."""

from __future__ import annotations

import pytest

from shardfuse.pipeline.config.embedder import EmbedderSettings
from shardfuse.pipeline.config.settings import Settings


@pytest.mark.parametrize(("provider", "expected"), [("local", True), ("openai", True), ("voyage", True),
                                                    ("hashing", False)])
def test_auto_asks_the_cache_for_every_model_but_the_hashing_one(provider: str, expected: bool) -> None:
    assert EmbedderSettings(provider=provider).uses_cache is expected  # type: ignore[arg-type]


def test_on_and_off_decide_whatever_the_provider() -> None:
    assert EmbedderSettings(provider="hashing", cache="on").uses_cache  # type: ignore[arg-type]
    assert not EmbedderSettings(provider="local", cache="off").uses_cache  # type: ignore[arg-type]


def test_the_setting_is_read_with_the_others_and_refuses_anything_else() -> None:
    assert Settings(embedder={"cache": "off"}).embedder.uses_cache is False
    with pytest.raises(ValueError, match="cache"):
        EmbedderSettings(cache="sometimes")  # type: ignore[arg-type]
