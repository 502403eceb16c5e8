"""Multi-document QA records, the lost-in-the-middle / LongBench-derived format, one JSON object per line (or a JSON
list): `{"question": str, "answers": [str], "ctxs": [{"title": str, "text": str, "isgold"?: bool}]}`. Reading
and writing them, building them from nq-open-oracle (gold passage among other questions' gold passages), and
turning them into a prompt set: contexts deduplicated into corpus documents (id = hash of title and text).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from pathlib import Path

from ...corpus import CorpusFormat, Document, render
from ...errors import SiftError
from ..datasets import data_dir, nq_items, nq_records
from .prompt_sets import PromptSet, PromptSpec


def read_qa_records(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise SiftError(f"QA file not found: {path}")
    opener = gzip.open if p.name.endswith(".gz") else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise SiftError(f"{path}: cannot read ({exc})") from exc
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SiftError(f"{path}: invalid JSON ({exc.msg})") from exc
        origins = [f"{path}[{i}]" for i in range(len(records))]
    else:
        records, origins = [], []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SiftError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from exc
            origins.append(f"{path}:{lineno}")
    for rec, origin in zip(records, origins):
        if not isinstance(rec, dict) or not isinstance(rec.get("question"), str) or not rec.get("ctxs"):
            raise SiftError(f"{origin}: expected {{\"question\", \"answers\", \"ctxs\": [{{\"title\", \"text\"}}]}}")
        if not isinstance(rec.get("answers"), list) or not rec["answers"]:
            raise SiftError(f"{origin}: \"answers\" must be a non-empty list of strings")
        for c in rec["ctxs"]:
            if not isinstance(c, dict) or not isinstance(c.get("text"), str) or not c["text"].strip():
                raise SiftError(f"{origin}: every ctx needs a non-empty \"text\"")
    if not records:
        raise SiftError(f"{path}: no records")
    return records

def write_qa_records(records: list[dict], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return p

def build_nq_records(data: str | Path | None, n_docs: int, n_questions: int, gold_position: int | None = None,
                     seed: int = 0) -> list[dict]:
    """Records from nq-open-oracle: the gold passage plus n_docs - 1 other questions' gold passages as
    distractors (STUDY.md's set-up), gold at `gold_position` (0-based; None: random)."""
    nq = nq_records(data_dir(data))
    items = nq_items(nq, n_docs=n_docs, n_items=n_questions, seed=seed, gold_position=gold_position)
    out = []
    for it in items:
        ctxs = []
        for d in it.doc_ids:
            c = nq[int(d[2:])]["ctxs"][0]
            ctxs.append({"title": c.get("title", ""), "text": c["text"], "isgold": d == it.gold})
        out.append({"question": it.question, "answers": list(it.answers), "ctxs": ctxs,
                    "gold_index": list(it.doc_ids).index(it.gold)})
    return out

def ctx_id(ctx: dict) -> str:
    h = hashlib.sha256(f"{ctx.get('title') or ''}\n{ctx['text']}".encode("utf-8")).hexdigest()
    return "c" + h[:16]

def _gold_index(rec: dict) -> int | None:
    if isinstance(rec.get("gold_index"), int):
        return rec["gold_index"]
    for i, c in enumerate(rec["ctxs"]):
        if c.get("isgold"):
            return i
    for i, c in enumerate(rec["ctxs"]):
        if c.get("hasanswer"):
            return i
    return None

def truncate_ctxs(rec: dict, n_docs: int) -> list[dict]:
    """The first n_docs contexts, keeping the gold one (at min(its index, n_docs - 1))."""
    ctxs = rec["ctxs"]
    if n_docs >= len(ctxs):
        return list(ctxs)
    g = _gold_index(rec)
    if g is None or g < n_docs:
        return list(ctxs[:n_docs])
    others = [c for i, c in enumerate(ctxs) if i != g][: n_docs - 1]
    return others + [ctxs[g]]

def records_prompt_set(records: list[dict], name: str = "qa", n_docs: int | None = None,
                       fmt: CorpusFormat = CorpusFormat()) -> PromptSet:
    docs: dict[str, Document] = {}
    prompts = []
    for rec in records:
        ctxs = truncate_ctxs(rec, n_docs) if n_docs else rec["ctxs"]
        ids = []
        for c in ctxs:
            i = ctx_id(c)
            if i not in docs:
                docs[i] = Document(i, render(fmt, i, c["text"], c.get("title") or None), "ctx")
            ids.append(i)
        prompts.append(PromptSpec(tuple(ids), rec["question"], tuple(map(str, rec["answers"]))))
    return PromptSet(f"{name}{n_docs or ''}", docs, prompts)

def sample_records(records: list[dict], n: int | None, seed: int = 0) -> list[dict]:
    if n is None or n >= len(records):
        return records
    return random.Random(seed).sample(records, n)


def gold_position(text: str) -> int | None:
    """`--gold-position`: a 0-based slot, or random (None)."""
    if text == "random":
        return None
    try:
        v = int(text)
    except ValueError:
        raise SiftError(f"--gold-position {text!r}: expected an integer or random") from None
    if v < 0:
        raise SiftError("--gold-position must be >= 0")
    return v


def build_qa_file(out: str | Path, n_docs: int, questions: int, gold: str = "random", seed: int = 0,
                  data: str | Path | None = None) -> dict:
    """`sift eval build-qa`: NQ records written to `out`; what was written."""
    recs = build_nq_records(data, n_docs, questions, gold_position(gold), seed)
    p = write_qa_records(recs, out)
    return {"out": str(p), "records": len(recs), "n_docs": n_docs, "gold_position": gold, "seed": seed}
