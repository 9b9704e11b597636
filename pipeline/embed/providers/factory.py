"""Build the configured embedder: one entry per :class:`EmbedderProvider`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from shardfuse.pipeline.config.settings import EmbedderProvider, EmbedderSettings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.embed.providers.base import Embedder
from shardfuse.pipeline.embed.providers.hashing import HashingEmbedder
from shardfuse.pipeline.embed.providers.input_limits import ProviderLimits
from shardfuse.pipeline.embed.providers.local import LocalEmbedder
from shardfuse.pipeline.embed.providers.openai import OpenAIEmbedder
from shardfuse.pipeline.embed.providers.voyage import VoyageEmbedder

# Inputs per forward pass of an in-process model (local, hashing) when embedder.batch_size is unset.
LOCAL_BATCH_SIZE = 64

_BUILDERS: Mapping[EmbedderProvider, Callable[[EmbedderSettings, Path], Embedder]] = MappingProxyType(
    {
        EmbedderProvider.LOCAL: lambda s, models: LocalEmbedder(
            s.model, batch_size=s.batch_size or LOCAL_BATCH_SIZE, runtime=s.local_runtime, cache_dir=models,
            precision=s.local_precision, threads=s.local_threads,
        ),
        EmbedderProvider.HASHING: lambda s, models: HashingEmbedder(s.dimensions),
        # Remote providers are asked for settings.dimensions (models with a fixed size refuse any other).
        EmbedderProvider.OPENAI: lambda s, models: OpenAIEmbedder(
            s.model,
            api_key=s.api_key.get_secret_value(),
            base_url=s.base_url,
            dimensions=s.dimensions,
            timeout_s=s.request_timeout_s,
        ),
        EmbedderProvider.VOYAGE: lambda s, models: VoyageEmbedder(
            s.model,
            api_key=s.api_key.get_secret_value(),
            base_url=s.base_url,
            timeout_s=s.request_timeout_s,
            dimensions=s.dimensions,
        ),
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


def request_batch_size(settings: EmbedderSettings, embedder: Embedder) -> int:
    """Inputs per request: ``embedder.batch_size`` when set, else the provider's declared default."""
    if settings.batch_size is not None:
        return settings.batch_size
    limits: ProviderLimits | None = getattr(embedder, "limits", None)
    return limits.default_batch_size if limits is not None else LOCAL_BATCH_SIZE
