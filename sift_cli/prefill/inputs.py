"""A prompt's inputs as `sift prefill` reads them from files: its documents (`--docs`: ids, text files, or JSON
Lines records with or without text) and its query (`--query`)."""

from __future__ import annotations

from pathlib import Path

from ..corpus import (JSONL_SUFFIXES, CorpusFormat, Document, Skipped, is_text_file, json_lines, read_corpus,
                      record_document)
from ..errors import SiftError


def read_doc_ids(path: str | Path) -> list[str]:
    p = Path(path)
    if not p.exists():  # a pipe (a shell's `<(…)`) is read as a file
        raise SiftError(f"docs file not found: {path}")
    try:
        ids = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as exc:
        raise SiftError(f"{path}: not valid UTF-8") from exc
    ids = [i for i in ids if i and not i.startswith("#")]
    if not ids:
        raise SiftError(f"{path}: no document ids (one per line)")
    return ids


def read_documents(path: str | Path, fmt: CorpusFormat = CorpusFormat()) -> list[str | Document]:
    """A prompt's documents, in order, from `--docs`: a JSON Lines file (.jsonl, .jsonl.gz) of {id[, text[,
    title]]} records (with text: the document is that text; without: looked up by id), or a text file with one
    entry per line: a doc_id, or a .txt/.md file (relative to the docs file's folder, else to the working
    directory) whose text is the document, its id the file's stem as `sift profile` names it."""
    p = Path(path)
    if p.is_dir():
        raise SiftError(f"--docs {path} is a folder — give a file listing the prompt's documents, one per line, "
                        f"or a JSONL of {{id[, text]}} records")
    if not p.exists():
        raise SiftError(f"docs file not found: {path}")
    if p.name.lower().endswith(JSONL_SUFFIXES):
        return _jsonl_documents(p, fmt)
    docs: list[str | Document] = []
    for entry in read_doc_ids(p):
        if not is_text_file(Path(entry)):
            docs.append(entry)
            continue
        file = next((f for f in (p.parent / entry, Path(entry)) if f.is_file()), None)
        if file is None:
            raise SiftError(f"{path}: document file {entry!r} not found (next to {p.name} or here)")
        docs.extend(read_corpus(file, fmt))
    return docs


def _jsonl_documents(path: Path, fmt: CorpusFormat) -> list[str | Document]:
    docs: list[str | Document] = []
    for origin, rec in json_lines(path):
        if not isinstance(rec, dict) or fmt.id_field not in rec:
            raise SiftError(f"{origin}: expected an object with an {fmt.id_field!r} field")
        if rec.get(fmt.text_field) is None:  # by id
            docs.append(str(rec[fmt.id_field]))
            continue
        doc = record_document(rec, origin, fmt)  # as text, read as a corpus record is
        if isinstance(doc, Skipped):
            raise SiftError(f"{doc.origin}: {doc.reason} — {doc.remedy or 'fix the record'}")
        docs.append(doc)
    if not docs:
        raise SiftError(f"{path}: no documents")
    return docs


def read_query(path: str | Path) -> str:
    p = Path(path)
    if p.is_dir():
        raise SiftError(f"--query {path} is a folder — give the file holding the question")
    if not p.exists():
        raise SiftError(f"query file not found: {path}")
    try:
        text = p.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError as exc:
        raise SiftError(f"{path}: not valid UTF-8") from exc
    if not text:
        raise SiftError(f"{path}: the query is empty — write the question into it")
    return text
