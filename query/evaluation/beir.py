"""Reading a BEIR-layout dataset folder: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shardfuse.pipeline.core.errors import PermanentError


@dataclass(frozen=True, slots=True)
class BeirDocument:
    doc_id: str
    title: str
    text: str

    @property
    def content(self) -> str:
        """What is indexed: the title (when there is one) as the first line, then the text."""
        return f"{self.title}\n\n{self.text}" if self.title else self.text


@dataclass(frozen=True, slots=True)
class BeirDataset:
    name: str
    corpus: tuple[BeirDocument, ...]
    queries: dict[str, str]  # only the queries that have judgments in the split
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> grade


def load_beir(folder: Path, *, split: str = "test") -> BeirDataset:
    """Load a BEIR folder. CRLF line endings are tolerated (BEIR ships SciFact's qrels with them)."""
    folder = Path(folder)
    for name in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        if not (folder / name).is_file():
            raise PermanentError(f"{folder} is not a BEIR dataset folder: {name} is missing")
    qrels = _read_qrels(folder / "qrels" / f"{split}.tsv")
    all_queries = {row["_id"]: row["text"] for row in _read_jsonl(folder / "queries.jsonl")}
    missing = sorted(set(qrels) - set(all_queries))
    if missing:
        raise PermanentError(f"qrels/{split}.tsv judges {len(missing)} unknown query id(s), e.g. {missing[:3]}")
    corpus = tuple(
        BeirDocument(doc_id=str(row["_id"]), title=str(row.get("title") or ""), text=str(row.get("text") or ""))
        for row in _read_jsonl(folder / "corpus.jsonl")
    )
    return BeirDataset(
        name=folder.resolve().name,
        corpus=corpus,
        queries={qid: all_queries[qid] for qid in qrels},
        qrels=qrels,
    )


def _read_jsonl(path: Path) -> list[dict[str, str]]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise PermanentError(f"{path}:{number}: not JSON ({exc.msg})") from exc
    return rows


def _read_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        for number, raw in enumerate(handle, start=1):
            fields = raw.rstrip("\r\n").split("\t")
            if number == 1 and fields[0] == "query-id":
                continue
            if fields == [""]:
                continue
            if len(fields) != 3:
                raise PermanentError(f"{path}:{number}: expected 'query-id<TAB>corpus-id<TAB>score'")
            query_id, doc_id, score = fields
            try:
                qrels.setdefault(query_id, {})[doc_id] = int(score)
            except ValueError as exc:
                raise PermanentError(f"{path}:{number}: score {score!r} is not an integer") from exc
    return qrels
