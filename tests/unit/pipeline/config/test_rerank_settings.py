"""The ``[rerank]`` section: off by default, configured from a file or the environment, its key never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.core.errors import ConfigurationError

# No SHARDFUSE_* variable of the shell running the tests, and a HOME of its own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_settings_env")


def test_reranking_is_off_by_default() -> None:
    rerank = Settings().rerank
    assert rerank.provider == "none" and not rerank.active


def test_a_hosted_provider_from_the_environment_with_its_defaults_and_a_masked_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDFUSE_RERANK__PROVIDER", "cohere")
    monkeypatch.setenv("SHARDFUSE_RERANK__API_KEY", "co-SECRET-key")
    monkeypatch.setenv("SHARDFUSE_RERANK__BUDGET_MS", "250")
    settings = load_settings()
    rerank = settings.rerank
    assert (rerank.resolved_model, rerank.resolved_base_url, rerank.budget_ms) == (
        "rerank-v3.5", "https://api.cohere.com", 250)
    assert rerank.api_key.get_secret_value() == "co-SECRET-key"
    assert "co-SECRET-key" not in repr(settings) and "co-SECRET-key" not in str(rerank.model_dump())


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[rerank]\nprovider = "local"\n', "needs rerank.model"),
        ('[rerank]\nprovider = "tei"\n', "needs rerank.base_url"),
        ('[rerank]\nprovider = "openai"\n', "provider"),
        ('[rerank]\nbudget_ms = 0\n', "budget_ms"),
        ('[rerank]\ntop_n = 0\n', "top_n"),
    ],
)
def test_unusable_rerank_settings_are_configuration_errors(tmp_path: Path, toml: str, message: str) -> None:
    config = tmp_path / "site.toml"
    config.write_text(toml)
    with pytest.raises(ConfigurationError, match=message):
        load_settings(config)
