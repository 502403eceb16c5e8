"""Read a corpus into `Document(id, text)`: a directory of .txt/.md files, JSON Lines (.jsonl, .jsonl.gz,
.jsonl.zst) or Parquet. A template turns a record into the text that is tokenised.

Every problem names the file (and line or row) and stops the run before any model work starts.
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
import zstandard

from .errors import SiftError

TEXT_SUFFIXES = (".txt", ".md")
DEFAULT_TEMPLATE = "Title: {title}\n{text}\n\n"
DEFAULT_TEMPLATE_NO_TITLE = "{text}\n\n"


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str  # templated: exactly what is tokenised
    origin: str  # file[:line] for error messages


@dataclass(frozen=True)
class CorpusFormat:
    id_field: str = "id"
    text_field: str = "text"
    title_field: str = "title"
    template: str | None = None  # None: DEFAULT_TEMPLATE, or its title-less form when there is no title


def corpus_format(id_field: str = "id", text_field: str = "text", title_field: str = "title",
                  template: str | None = None) -> CorpusFormat:
    """A CorpusFormat from command-line values: backslash escapes in the template (\\n, \\t) are interpreted."""
    return CorpusFormat(id_field, text_field, title_field,
                        template.encode().decode("unicode_escape") if template else None)


def render(fmt: CorpusFormat, doc_id: str, text: str, title: str | None) -> str:
    if fmt.template is None:
        template = DEFAULT_TEMPLATE if title else DEFAULT_TEMPLATE_NO_TITLE
    else:
        template = fmt.template
    try:
        return template.format(id=doc_id, text=text, title=title or "")
    except (KeyError, IndexError, ValueError) as exc:
        raise SiftError(f"--template {template!r}: bad placeholder ({exc}); use {{id}}, {{title}}, {{text}}") from exc


def read_corpus(path: str | Path, fmt: CorpusFormat = CorpusFormat()) -> Iterator[Document]:
    p = Path(path)
    if not p.exists():
        raise SiftError(f"corpus not found: {path}")
    if p.is_dir():
        yield from _read_directory(p, fmt)
    elif p.name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson")):
        yield from _read_jsonl(p, fmt)
    elif p.suffix == ".parquet":
        yield from _read_parquet(p, fmt)
    elif p.suffix in TEXT_SUFFIXES:
        yield _text_document(p.stem, p, fmt)
    else:
        raise SiftError(f"corpus {path}: unknown format; expected a directory of .txt/.md files, "
                        f".jsonl[.gz|.zst] or .parquet")


def load_documents(path: str | Path, fmt: CorpusFormat = CorpusFormat()) -> list[Document]:
    """All documents, checked: non-empty corpus, unique ids, non-empty texts."""
    docs, seen = [], {}
    for doc in read_corpus(path, fmt):
        if not doc.doc_id:
            raise SiftError(f"{doc.origin}: empty document id")
        if doc.doc_id in seen:
            raise SiftError(f"{doc.origin}: duplicate document id {doc.doc_id!r} (first at {seen[doc.doc_id]})")
        seen[doc.doc_id] = doc.origin
        docs.append(doc)
    if not docs:
        raise SiftError(f"corpus {path}: no documents found")
    return docs


def _check_text(text: str, origin: str) -> str:
    if not text.strip():
        raise SiftError(f"{origin}: empty document; remove it from the corpus")
    return text


def _text_document(doc_id: str, file: Path, fmt: CorpusFormat) -> Document:
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SiftError(f"{file}: not valid UTF-8 (byte {exc.start}); convert it to UTF-8") from exc
    text = _check_text(text.removeprefix("\ufeff"), str(file))
    return Document(doc_id, render(fmt, doc_id, text, None), str(file))


def _read_directory(root: Path, fmt: CorpusFormat) -> Iterator[Document]:
    files = sorted(f for f in root.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES
                   and not any(part.startswith(".") for part in f.relative_to(root).parts))
    for f in files:
        doc_id = f.relative_to(root).with_suffix("").as_posix()
        yield _text_document(doc_id, f, fmt)


def _open_text(path: Path) -> io.TextIOBase:
    if path.name.endswith(".gz"):
        raw = gzip.open(path, "rb")
    elif path.name.endswith(".zst"):
        raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"))
    else:
        raw = open(path, "rb")
    return io.TextIOWrapper(io.BufferedReader(raw) if not isinstance(raw, io.BufferedReader) else raw,
                            encoding="utf-8", errors="strict")


def _record_document(rec: dict, origin: str, fmt: CorpusFormat) -> Document:
    if not isinstance(rec, dict):
        raise SiftError(f"{origin}: expected a JSON object per line")
    if fmt.id_field not in rec or fmt.text_field not in rec:
        raise SiftError(f"{origin}: record lacks field {fmt.id_field!r} or {fmt.text_field!r} "
                        f"(set --id-field / --text-field)")
    text = rec[fmt.text_field]
    if not isinstance(text, str):
        raise SiftError(f"{origin}: field {fmt.text_field!r} is not a string")
    title = rec.get(fmt.title_field)
    doc_id = str(rec[fmt.id_field])
    return Document(doc_id, render(fmt, doc_id, _check_text(text, origin), title if isinstance(title, str) else None),
                    origin)


def _read_jsonl(path: Path, fmt: CorpusFormat) -> Iterator[Document]:
    try:
        with _open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                origin = f"{path}:{lineno}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SiftError(f"{origin}: invalid JSON ({exc.msg})") from exc
                yield _record_document(rec, origin, fmt)
    except UnicodeDecodeError as exc:
        raise SiftError(f"{path}: not valid UTF-8; convert it to UTF-8") from exc
    except (OSError, EOFError) as exc:
        if isinstance(exc, SiftError):
            raise
        raise SiftError(f"{path}: cannot read ({exc}); is the file truncated or corrupt?") from exc
    except Exception as exc:  # zstandard raises its own error type for corrupt frames
        if isinstance(exc, SiftError):
            raise
        raise SiftError(f"{path}: cannot read ({exc}); is the file truncated or corrupt?") from exc


def _read_parquet(path: Path, fmt: CorpusFormat) -> Iterator[Document]:
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise SiftError(f"{path}: not a readable Parquet file ({exc})") from exc
    names = pf.schema_arrow.names
    for col in (fmt.id_field, fmt.text_field):
        if col not in names:
            raise SiftError(f"{path}: no column {col!r} (columns: {', '.join(names)}); "
                            f"set --id-field / --text-field")
    cols = [fmt.id_field, fmt.text_field] + ([fmt.title_field] if fmt.title_field in names else [])
    row = 0
    for batch in pf.iter_batches(columns=cols):
        data = batch.to_pydict()
        titles = data.get(fmt.title_field, [None] * batch.num_rows)
        for doc_id, text, title in zip(data[fmt.id_field], data[fmt.text_field], titles):
            origin = f"{path}:row {row}"
            row += 1
            if not isinstance(text, str):
                raise SiftError(f"{origin}: column {fmt.text_field!r} is not text")
            doc_id = str(doc_id)
            yield Document(doc_id, render(fmt, doc_id, _check_text(text, origin), title), origin)
