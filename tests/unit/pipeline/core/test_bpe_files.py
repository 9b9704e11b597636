"""Token counting offline without ``TIKTOKEN_CACHE_DIR``: the encoding is built from the BPE file on disk, exactly
as tiktoken builds it, and nothing opens a socket."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tiktoken

from shardfuse.pipeline.config.settings import Settings, settings_from_json
from shardfuse.pipeline.core.bpe_files import PROJECT_BPE_DIR, SPECS, find_bpe_file, offline_encoding
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.core.token_counting import TokenCounter
from tests.support.offline_child import run_offline
from tests.support.paths import REPO

TEXTS = ["hello world", "def prepare_chunks(text: str) -> list[str]:\n    return []\n", "naïve café 東京 🚀",
         "<|endoftext|> is ordinary text here", " \n\n\t  trailing   "]

# Run in a child with no TIKTOKEN_CACHE_DIR and an empty temp dir (tiktoken's fallback cache), offline
# (tests/support/offline_child.py).
CHILD = """
    from shardfuse.pipeline.core.token_counting import TokenCounter
    counter = TokenCounter()
    texts = json.loads(sys.argv[1])
    report({"counts": [counter.count(t) for t in texts], "tokens": counter.encode(texts[1])})
"""


def _shared_bpe_file() -> Path:
    found = find_bpe_file("cl100k_base", PROJECT_BPE_DIR)
    if found is None:
        pytest.skip(f"no cl100k_base BPE file in {PROJECT_BPE_DIR} (make install copies it there)")
    return found


def test_the_encoding_built_from_the_file_is_tiktokens_own() -> None:
    local = offline_encoding("cl100k_base", bpe_dir=_shared_bpe_file().parent)
    reference = tiktoken.get_encoding("cl100k_base")  # tests/conftest.py points tiktoken's cache at the file
    assert local is not None and local is not reference
    assert local.name == reference.name
    assert local._pat_str == reference._pat_str
    assert local._special_tokens == reference._special_tokens
    assert local._mergeable_ranks == reference._mergeable_ranks
    for text in TEXTS:
        assert local.encode_ordinary(text) == reference.encode_ordinary(text)


def test_counts_offline_without_tiktoken_cache_dir_match_counts_with_it(tmp_path: Path) -> None:
    _shared_bpe_file()
    child = run_offline(CHILD, [json.dumps(TEXTS)], cwd=tmp_path, unset=("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"),
                        env={"TMPDIR": str(tmp_path)})
    with_cache_dir = TokenCounter()  # this process has TIKTOKEN_CACHE_DIR (tests/conftest.py)
    reference = tiktoken.get_encoding("cl100k_base")
    assert child["counts"] == [with_cache_dir.count(t) for t in TEXTS] == [len(reference.encode_ordinary(t))
                                                                          for t in TEXTS]
    assert child["tokens"] == reference.encode_ordinary(TEXTS[1])
    assert child["attempts"] == []


def test_a_configured_folder_may_hold_the_published_file_name(tmp_path: Path) -> None:
    shutil.copyfile(_shared_bpe_file(), tmp_path / "cl100k_base.tiktoken")
    counter = TokenCounter(bpe_dir=tmp_path)
    assert counter.count(TEXTS[1]) == len(tiktoken.get_encoding("cl100k_base").encode_ordinary(TEXTS[1]))


def test_a_configured_folder_without_the_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"chunking.bpe_dir .* holds no BPE file for 'cl100k_base' "
                                                 r"\(looked for 9b5ad71b2ce5302211f9c61530b329a4922fc6a4 or "
                                                 r"cl100k_base.tiktoken\)"):
        TokenCounter(bpe_dir=tmp_path)


def test_a_damaged_file_is_refused_by_its_hash(tmp_path: Path) -> None:
    data = _shared_bpe_file().read_bytes()
    (tmp_path / "cl100k_base.tiktoken").write_bytes(data[:-10] + b"AAAA 99999\n")
    with pytest.raises(ConfigurationError, match=r"is not the published cl100k_base BPE file \(its SHA-256 is not"):
        TokenCounter(bpe_dir=tmp_path)


def test_the_file_name_tiktoken_caches_it_under_is_derived_from_its_url() -> None:
    assert SPECS["cl100k_base"].cache_name == "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
    assert PROJECT_BPE_DIR == REPO / ".cache" / "tiktoken"


def test_workers_get_the_launchers_bpe_dir(tmp_path: Path) -> None:
    # The stack's processes are handed the launcher's settings as JSON (pipeline/config/handoff.py).
    settings = Settings.model_validate({"chunking": {"bpe_dir": str(tmp_path)}})
    assert settings_from_json(settings.model_dump_json()).chunking.bpe_dir == tmp_path
