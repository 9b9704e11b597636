"""tiktoken encodings built from a BPE file on disk: no network, no ``TIKTOKEN_CACHE_DIR`` to export.

tiktoken itself finds an encoding's BPE file only through ``$TIKTOKEN_CACHE_DIR`` (or a folder in /tmp) and
downloads it when that misses, so a command run by hand on an offline host, without the variable the Makefile
exports, failed at its first ingest. Here the file is looked for in a folder (``chunking.bpe_dir``, else the
checkout's ``.cache/tiktoken`` that ``make install`` fills) under either name it goes by — tiktoken's cache
name ``sha1(<download URL>)`` or the published ``<encoding>.tiktoken`` — checked against the SHA-256 tiktoken
expects, and the :class:`tiktoken.Encoding` is constructed exactly as ``tiktoken_ext.openai_public`` constructs
it (same split pattern, same special tokens; a unit test compares the two). Encodings not listed here, or no
file found, take tiktoken's own path.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import tiktoken
from tiktoken.load import check_hash, read_file
from tiktoken_ext import openai_public

from shardfuse.pipeline.core.errors import ConfigurationError

# The checkout's cache folder (pipeline/core/ is two levels below the repository root, which is the package).
PROJECT_BPE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "tiktoken"


@dataclass(frozen=True)
class BpeSpec:
    """How ``tiktoken_ext.openai_public`` builds one encoding: where its BPE file is published (its URL names
    tiktoken's cache file), the file's SHA-256, the pre-tokenizer pattern and the special tokens."""

    url: str
    sha256: str
    pat_str: str
    special_tokens: dict[str, int]

    @property
    def cache_name(self) -> str:
        """The file's name in tiktoken's cache folder: sha1 of its URL."""
        return hashlib.sha1(self.url.encode()).hexdigest()

    def file_names(self, encoding: str) -> tuple[str, str]:
        return self.cache_name, f"{encoding}.tiktoken"


# Copied from tiktoken_ext/openai_public.py (cl100k_base), whose constructor downloads the file instead of taking
# one: tests/unit/pipeline/core/test_bpe_files.py fails if tiktoken's own ever differs.
SPECS: dict[str, BpeSpec] = {
    "cl100k_base": BpeSpec(
        url="https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pat_str=r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",  # noqa: E501
        special_tokens={
            openai_public.ENDOFTEXT: 100257,
            openai_public.FIM_PREFIX: 100258,
            openai_public.FIM_MIDDLE: 100259,
            openai_public.FIM_SUFFIX: 100260,
            openai_public.ENDOFPROMPT: 100276,
        },
    ),
}


def find_bpe_file(encoding: str, folder: Path) -> Path | None:
    """``encoding``'s BPE file in ``folder`` (under either of its names), or None."""
    spec = SPECS.get(encoding)
    if spec is None:
        return None
    for name in spec.file_names(encoding):
        if (folder / name).is_file():
            return folder / name
    return None


def offline_encoding(encoding: str, *, bpe_dir: Path | None) -> tiktoken.Encoding | None:
    """``encoding`` built from its BPE file in ``bpe_dir``, else in the checkout's ``.cache/tiktoken``; None
    when neither holds it (or tiktoken has no file-based recipe for it here): then use tiktoken's own path.

    ConfigurationError if ``bpe_dir`` is given but holds no such file, or a file found is not the published one.
    """
    if bpe_dir is not None:
        path = find_bpe_file(encoding, bpe_dir.expanduser())
        if path is None and encoding in SPECS:
            names = " or ".join(SPECS[encoding].file_names(encoding))
            raise ConfigurationError(f"chunking.bpe_dir {str(bpe_dir)!r} holds no BPE file for {encoding!r} "
                                     f"(looked for {names})")
    else:
        path = find_bpe_file(encoding, PROJECT_BPE_DIR)
    return None if path is None else _load(encoding, path)


# Bounded: one entry per (encoding, file), and a process uses one or two. tiktoken memoises what it loads the
# same way (tiktoken.registry.ENCODINGS); a rank table costs ~1 s and ~100 MB to build.
@functools.lru_cache(maxsize=4)
def _load(encoding: str, path: Path) -> tiktoken.Encoding:
    spec = SPECS[encoding]
    try:
        data = read_file(str(path))
    except OSError as exc:
        raise ConfigurationError(f"cannot read the {encoding} BPE file {path}: {exc.strerror or exc}") from exc
    if not check_hash(data, spec.sha256):
        raise ConfigurationError(f"{path} is not the published {encoding} BPE file (its SHA-256 is not "
                                 f"{spec.sha256}); replace it with a copy of {spec.url}")
    return tiktoken.Encoding(name=encoding, pat_str=spec.pat_str, mergeable_ranks=_ranks(data),
                             special_tokens=spec.special_tokens)


def _ranks(data: bytes) -> dict[bytes, int]:
    """The rank table of a ``.tiktoken`` file: one ``<base64 token> <rank>`` per line.

    This is :func:`tiktoken.load.load_tiktoken_bpe`'s parse; that function also copies every file it reads
    into tiktoken's cache folder (a second copy of the file we just found in it), so it is not called here.
    """
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks
