"""embedder.local_precision: int8 only where it means something (the local model under ONNX Runtime)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shardfuse.pipeline.config.settings import EmbedderProvider, EmbedderSettings, load_settings
from shardfuse.pipeline.core.errors import ConfigurationError

# No SHARDFUSE_* variable of the shell running the tests, and a HOME of its own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_settings_env")


def test_fp32_is_the_default_and_int8_is_accepted_for_the_local_onnx_model() -> None:
    assert EmbedderSettings().local_precision == "fp32"
    assert EmbedderSettings(local_precision="int8").local_precision == "int8"


@pytest.mark.parametrize("fields", [{"provider": EmbedderProvider.HASHING}, {"local_runtime": "torch"},
                                    {"provider": EmbedderProvider.OPENAI}])
def test_int8_elsewhere_is_refused_with_what_it_needs(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match='needs embedder.provider = "local" and embedder.local_runtime = "onnx"'):
        EmbedderSettings(local_precision="int8", **fields)  # type: ignore[arg-type]


def test_an_unknown_precision_or_negative_threads_is_refused() -> None:
    with pytest.raises(ValidationError):
        EmbedderSettings(local_precision="int4")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        EmbedderSettings(local_threads=-1)


def test_the_environment_sets_them_and_a_bad_mix_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDFUSE_EMBEDDER__LOCAL_PRECISION", "int8")
    monkeypatch.setenv("SHARDFUSE_EMBEDDER__LOCAL_THREADS", "1")
    settings = load_settings(embedder={"provider": "local"})
    assert (settings.embedder.local_precision, settings.embedder.local_threads) == ("int8", 1)
    with pytest.raises(ConfigurationError, match="local_precision"):
        load_settings(embedder={"provider": "hashing"})
