"""Real text for evaluations and benchmarks: Natural Questions with gold Wikipedia passages, and long essays.

Nothing is bundled: the files are looked up in --data-dir, $SIFT_DATA_DIR, or ../shared/data beside the
repository. Builders return corpus records ({id, title, text}) and prompts (doc_ids, question, answers) with
the layout of `STUDY.md`: gold passage among distractors, or essays cut to their first words.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import SiftError

NQ_FILE = "nq-open-oracle.jsonl.gz"
_REPO = Path(__file__).resolve().parents[2]  # sift_cli/lab/datasets.py → the repository (or site-packages)
ESSAY_DIR = "paul-graham-essays"


def data_dir(explicit: str | Path | None = None) -> Path:
    candidates = [Path(explicit)] if explicit else []
    if os.environ.get("SIFT_DATA_DIR"):
        candidates.append(Path(os.environ["SIFT_DATA_DIR"]))
    candidates.append(_REPO.parent / "shared" / "data")
    for c in candidates:
        if c.is_dir() and ((c / NQ_FILE).is_file() or (c / ESSAY_DIR).is_dir()):
            return c
    raise SiftError("evaluation data not found (sift bundles none) — pass --data-dir or set SIFT_DATA_DIR to a "
                    f"folder holding {NQ_FILE} and/or {ESSAY_DIR}/")


@dataclass(frozen=True)
class QAItem:
    question: str
    answers: tuple[str, ...]
    doc_ids: tuple[str, ...]  # in prompt order
    gold: str  # doc_id of the gold passage


def nq_records(path: str | Path) -> list[dict]:
    p = Path(path)
    if p.is_dir():
        p = p / NQ_FILE
    if not p.is_file():
        raise SiftError(f"NQ file not found: {p}")
    with gzip.open(p, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def nq_passages(records: list[dict]) -> list[dict]:
    """One corpus record per question: its gold passage, id nq00000…"""
    out = []
    for i, r in enumerate(records):
        ctx = r["ctxs"][0]
        out.append({"id": f"nq{i:05d}", "title": ctx.get("title", ""), "text": ctx["text"]})
    return out


def nq_items(records: list[dict], n_docs: int, n_items: int, seed: int = 0,
             gold_position: int | None = None) -> list[QAItem]:
    """Questions with their gold passage and n_docs - 1 other questions' gold passages as distractors.

    gold_position: 0-based slot of the gold passage (None: random, as in STUDY.md).
    """
    if n_docs < 1 or n_docs > len(records):
        raise SiftError(f"n_docs must be between 1 and {len(records)}")
    rng = random.Random(seed)
    picked = rng.sample(range(len(records)), min(n_items, len(records)))
    items = []
    for q in picked:
        others = rng.sample([i for i in range(len(records)) if i != q], n_docs - 1)
        pos = rng.randrange(n_docs) if gold_position is None else min(gold_position, n_docs - 1)
        order = others[:pos] + [q] + others[pos:]
        items.append(QAItem(records[q]["question"], tuple(records[q]["answers"]),
                            tuple(f"nq{i:05d}" for i in order), f"nq{q:05d}"))
    return items


def essay_records(path: str | Path, words: int = 1600) -> list[dict]:
    """Each essay cut to its first `words` words (whitespace-separated, paragraphs kept), no title."""
    d = Path(path)
    if (d / ESSAY_DIR).is_dir():
        d = d / ESSAY_DIR
    files = sorted(f for f in d.glob("*.txt") if f.name != "SOURCE-LICENSE.txt")
    if not files:
        raise SiftError(f"no essays (*.txt) in {d}")
    out = []
    for f in files:
        text = f.read_text(encoding="utf-8")
        kept, count = [], 0
        for para in text.split("\n"):
            w = para.split()
            if count + len(w) > words:
                kept.append(" ".join(w[: words - count]))
                break
            kept.append(para)
            count += len(w)
        out.append({"id": f.stem, "title": "", "text": "\n".join(kept).strip()})
    return out


def long_essays(records: list[dict], min_words: int) -> list[dict]:
    return [r for r in records if len(r["text"].split()) >= min_words]


def write_jsonl(records: list[dict], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return p
