"""Build the configured embedder: one entry per :class:`EmbedderProvider`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from pipeline.embeddings.base import Embedder
from pipeline.embeddings.hashing import HashingEmbedder
from pipeline.embeddings.local import LocalEmbedder
from pipeline.errors import ConfigurationError
from pipeline.settings import EmbedderProvider, EmbedderSettings

_BUILDERS: Mapping[EmbedderProvider, Callable[[EmbedderSettings, Path], Embedder]] = MappingProxyType(
    {
        EmbedderProvider.LOCAL: lambda s, models: LocalEmbedder(
            s.model, batch_size=s.batch_size, runtime=s.local_runtime, cache_dir=models
        ),
        EmbedderProvider.HASHING: lambda s, models: HashingEmbedder(s.dimensions),
    }
)


def build_embedder(settings: EmbedderSettings, *, models_dir: Path) -> Embedder:
    """The embedder ``settings`` describe; ``models_dir`` holds derived model files (ONNX exports).

    Raises :class:`ConfigurationError` when ``settings.dimensions`` disagrees with what the model produces:
    the shards' ``vector(d)`` columns are sized from it."""
    try:
        builder = _BUILDERS[settings.provider]
    except KeyError:
        raise ConfigurationError(f"no embedder for provider {settings.provider!r}") from None
    embedder = builder(settings, models_dir)
    if embedder.dimensions != settings.dimensions:
        raise ConfigurationError(
            f"embedder.dimensions is {settings.dimensions} but {embedder.name} produces "
            f"{embedder.dimensions}-dimensional vectors; set embedder.dimensions = {embedder.dimensions} "
            f"(SHARDFUSE_EMBEDDER__DIMENSIONS={embedder.dimensions})"
        )
    return embedder
