"""search: BM25 over a local text corpus (no network).

The corpus is a directory of .txt / .md files (split into passages at blank lines) or a .jsonl file
with one passage per line: {"text": ..., "title": ...}. It is indexed once when the tool is built.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rollout_service.tools.base import ToolError

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass
class Passage:
    title: str
    text: str


def load_corpus(path: str | Path) -> list[Passage]:
    p = Path(path)
    if not p.exists():
        raise ValueError(f"rollout.tools.corpus: {p} does not exist (a directory of .txt/.md files or a .jsonl)")
    out: list[Passage] = []
    if p.is_dir():
        for f in sorted(list(p.rglob("*.txt")) + list(p.rglob("*.md"))):
            for chunk in re.split(r"\n\s*\n", f.read_text(errors="replace")):
                if chunk.strip():
                    out.append(Passage(f.stem, chunk.strip()))
    else:
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append(Passage(str(row.get("title", "")), str(row["text"])))
            except (json.JSONDecodeError, KeyError, AttributeError) as exc:
                raise ValueError(f"{p}:{n}: expected a JSON object with a 'text' field ({exc})") from None
    if not out:
        raise ValueError(f"rollout.tools.corpus: {p} holds no passages")
    return out


class BM25:
    def __init__(self, passages: list[Passage], k1: float = 1.5, b: float = 0.75):
        self.passages, self.k1, self.b = passages, k1, b
        self.tf = [Counter(words(p.title + " " + p.text)) for p in passages]
        self.len = [sum(c.values()) for c in self.tf]
        self.avg = sum(self.len) / max(len(self.len), 1)
        df = Counter(w for c in self.tf for w in c)
        n = len(passages)
        self.idf = {w: math.log(1 + (n - d + 0.5) / (d + 0.5)) for w, d in df.items()}

    def search(self, query: str, k: int) -> list[tuple[float, Passage]]:
        q = set(words(query))
        scored = []
        for i, tf in enumerate(self.tf):
            s = 0.0
            for w in q:
                f = tf.get(w, 0)
                if f:
                    s += self.idf[w] * f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * self.len[i] / self.avg))
            if s > 0:
                scored.append((s, i))
        scored.sort(key=lambda x: (-x[0], x[1]))
        return [(s, self.passages[i]) for s, i in scored[:k]]


class CorpusSearch:
    name = "search"
    description = "Search a local text collection; returns the best matching passages."
    parameters = {"type": "object", "properties": {"query": {"type": "string", "description": "Search words."}},
                  "required": ["query"]}

    def __init__(self, corpus: str | Path | list[Passage], top_k: int = 3):
        self.index = BM25(corpus if isinstance(corpus, list) else load_corpus(corpus))
        self.top_k = top_k

    async def run(self, args: dict) -> str:
        query = str(args["query"])
        if not words(query):
            raise ToolError("empty query")
        hits = self.index.search(query, self.top_k)
        if not hits:
            return "no results"
        return "\n".join(f"[{n}] {p.title + ': ' if p.title else ''}{p.text}" for n, (_, p) in enumerate(hits, 1))
