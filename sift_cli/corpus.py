"""Read a corpus into `Document(id, text)`: a directory of .txt/.md files, JSON Lines (.jsonl, .jsonl.gz,
.jsonl.zst) or Parquet. A template turns a record into the text that is tokenised.

A document's id: in a directory, the file's path relative to the directory without its .txt/.md extension, with
`/` between folders (`licenses/apache-2.0.txt` → `licenses/apache-2.0`); in JSONL and Parquet, the id field as a
string. Extensions are matched in any case (`D.TXT` is a document); other files of a directory are not
documents: they are reported as ignored (hidden files and folders, starting with `.`, are left out silently).

`load_corpus` reads every document and collects, in one pass, the ones that cannot be profiled (empty, not UTF-8,
a record without its id or text field...) with their reason, so one run reports them all; the caller decides
whether they stop the run (`Corpus.check`) or are skipped. Problems of the corpus itself (not found, unknown format,
a corrupt compressed file, a missing Parquet column, duplicate ids, no documents) stop it, naming the file.
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
import zstandard

from .errors import SiftError

TEXT_SUFFIXES = (".txt", ".md")  # matched case-insensitively
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson")
DEFAULT_TEMPLATE = "Title: {title}\n{text}\n\n"
DEFAULT_TEMPLATE_NO_TITLE = "{text}\n\n"


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str  # templated: exactly what is tokenised
    origin: str  # file[:line] for error messages


@dataclass(frozen=True)
class Skipped:
    """A document that cannot be profiled (kind "document": its id when known) or a file of a corpus directory
    that is not a document (kind "file"), and why."""
    origin: str  # file[:line | :row N]
    reason: str
    doc_id: str | None = None
    kind: str = "document"
    remedy: str | None = None  # what fixes it, when that is specific (set --text-field, convert to UTF-8)

    def line(self) -> str:
        return f"{self.origin}: {self.reason}" + (f"; {self.remedy}" if self.remedy else "")

    def to_json(self) -> dict:
        return {"doc_id": self.doc_id, "origin": self.origin, "reason": self.reason}


@dataclass
class Corpus:
    """What `load_corpus` read: the documents, the documents that cannot be profiled and the files that are not
    documents."""
    path: str
    documents: list[Document]
    bad: list[Skipped] = field(default_factory=list)
    ignored_files: list[Skipped] = field(default_factory=list)

    def check(self, remedy: str = "fix or remove {them}") -> "Corpus":
        """Raise, listing every bad document, if there is any. remedy: what to do, "{them}" standing for "it" or
        "them"."""
        if len(self.bad) == 1:
            b = self.bad[0]
            raise SiftError(f"{b.origin}: {b.reason} — {b.remedy or remedy.format(them='it')}")
        if self.bad:
            raise SiftError(f"{self.path}: {len(self.bad)} documents cannot be profiled — "
                            f"{remedy.format(them='them')}", [b.line() for b in self.bad])
        return self


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
        raise SiftError(f"--template {template!r}: bad placeholder ({exc}) — use {{id}}, {{title}} and {{text}}") \
            from exc


def is_text_file(path: Path) -> bool:
    return path.suffix.lower() in TEXT_SUFFIXES


def check_corpus_path(path: str | Path) -> Path:
    """The corpus path, if it exists and has a format sift reads (cheap: nothing is read)."""
    p = Path(path)
    if not p.exists():
        raise SiftError(f"corpus not found: {path} — pass a directory of .txt/.md files, a .jsonl[.gz|.zst] or "
                        f".parquet file, or builtin:stdlib-docs")
    if not (p.is_dir() or p.name.lower().endswith(JSONL_SUFFIXES) or p.suffix.lower() == ".parquet"
            or is_text_file(p)):
        raise SiftError(f"corpus {path}: unknown format — pass a directory of .txt/.md files, a .jsonl[.gz|.zst] "
                        f"or a .parquet file")
    return p


def read_corpus(path: str | Path, fmt: CorpusFormat = CorpusFormat()) -> Iterator[Document]:
    """Every document of the corpus, in order; raises at the first one that cannot be profiled (files of a
    directory that are not documents are passed over). `load_corpus` reads them all and lists every problem."""
    for item in iter_corpus(path, fmt):
        if isinstance(item, Document):
            yield item
        elif item.kind == "document":
            raise SiftError(f"{item.line()} — fix or remove the document")


def iter_corpus(path: str | Path, fmt: CorpusFormat = CorpusFormat()) -> Iterator[Document | Skipped]:
    """Every document of the corpus, in order, and in their place what cannot be profiled or is not a document."""
    p = check_corpus_path(path)
    if p.is_dir():
        yield from _read_directory(p, fmt)
    elif p.name.lower().endswith(JSONL_SUFFIXES):
        yield from _read_jsonl(p, fmt)
    elif p.suffix.lower() == ".parquet":
        yield from _read_parquet(p, fmt)
    else:
        yield _text_document(p.stem, p, fmt)


def load_corpus(path: str | Path, fmt: CorpusFormat = CorpusFormat()) -> Corpus:
    """Every document, every bad document (with its reason) and every ignored file, in one pass; raises on
    problems of the corpus itself: duplicate ids (all listed) and no document at all."""
    corpus = Corpus(str(path), [])
    seen: dict[str, str] = {}
    duplicates = []
    for item in iter_corpus(path, fmt):
        if isinstance(item, Skipped):
            (corpus.ignored_files if item.kind == "file" else corpus.bad).append(item)
            continue
        if item.doc_id in seen:
            duplicates.append(f"{item.origin}: id {item.doc_id!r} (first at {seen[item.doc_id]})")
            continue
        seen[item.doc_id] = item.origin
        corpus.documents.append(item)
    if duplicates:
        raise SiftError(f"{path}: {len(duplicates)} duplicate document id{'s' if len(duplicates) > 1 else ''} — "
                        f"give every document its own id", duplicates)
    if not corpus.documents:
        if corpus.bad:
            corpus.check()  # not one document can be profiled: say why for each
        raise SiftError(f"corpus {path}: no documents found — sift reads .txt/.md files of a directory (any case), "
                        f".jsonl[.gz|.zst] and .parquet files", [s.line() for s in corpus.ignored_files])
    return corpus


def load_documents(path: str | Path, fmt: CorpusFormat = CorpusFormat()) -> list[Document]:
    """All documents, checked: non-empty corpus, unique ids, every document readable (all bad ones listed)."""
    return load_corpus(path, fmt).check().documents


def _text_of(raw: bytes) -> tuple[str | None, str | None, str | None]:
    """(text, None, None) or (None, reason, remedy or None)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not valid UTF-8 (byte {exc.start})", "convert it to UTF-8"
    text = text.removeprefix("\ufeff")
    if not text.strip():
        return None, "empty document", None
    return text, None, None


def _text_document(doc_id: str, file: Path, fmt: CorpusFormat) -> Document | Skipped:
    try:
        raw = file.read_bytes()
    except OSError as exc:
        return Skipped(str(file), f"cannot be read ({exc.strerror or exc})", doc_id)
    text, problem, remedy = _text_of(raw)
    if problem:
        return Skipped(str(file), problem, doc_id, remedy=remedy)
    return Document(doc_id, render(fmt, doc_id, text, None), str(file))


def _read_directory(root: Path, fmt: CorpusFormat) -> Iterator[Document | Skipped]:
    files = sorted(f for f in root.rglob("*") if f.is_file()
                   and not any(part.startswith(".") for part in f.relative_to(root).parts))
    for f in files:
        if not is_text_file(f):
            yield Skipped(str(f), f"not a document: sift reads .txt and .md files (any case), not "
                                  f"{f.suffix or 'files without an extension'}", kind="file")
            continue
        rel = f.relative_to(root)
        doc_id = rel.with_name(rel.stem).as_posix()
        yield _text_document(doc_id, f, fmt)


def _open_binary(path: Path) -> io.BufferedIOBase:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.name.endswith(".zst"):
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def _jsonl_values(path: Path, unreadable: str) -> Iterator[tuple[str, object, ValueError | None]]:
    """(origin "file:line", value, None) for every non-blank line of a JSON Lines file, compressed or not, and
    (origin, None, the UnicodeDecodeError or JSONDecodeError) for a line that does not parse; an unreadable file
    stops with one error ending in `unreadable` (what to do)."""
    try:
        with _open_binary(path) as f:
            first = True
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                origin = f"{path}:{lineno}"
                was_first, first = first, False
                try:
                    line = raw.decode("utf-8")
                    value = json.loads(line.removeprefix("\ufeff") if lineno == 1 else line)
                except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                    if was_first:
                        _refuse_one_json_document(path, raw)
                    yield origin, None, exc
                    continue
                yield origin, value, None
    except SiftError:
        raise
    except Exception as exc:  # OSError, EOFError, zstandard's own error type for corrupt frames
        raise SiftError(f"{path}: cannot read ({exc}) — the file is truncated or corrupt: {unreadable}") from exc


def _refuse_one_json_document(path: Path, first_line: bytes) -> None:
    """A first line that opens a JSON array or object without closing it: the file is one (pretty-printed) JSON
    document, not JSON Lines; one error rather than one per line."""
    head = first_line.strip().removeprefix(b"\xef\xbb\xbf")
    if head.startswith(b"[") or head == b"{":
        raise SiftError(f"{path}: holds one JSON {'array' if head.startswith(b'[') else 'object'} over many lines, "
                        f"not JSON Lines (one object per line) — write one record per line, e.g. "
                        f"`jq -c '.[]' FILE > records.jsonl`")


def json_lines(path: Path) -> Iterator[tuple[str, object]]:
    """(origin "file:line", value) of every non-blank line of a JSON Lines file, compressed or not; an unreadable
    file or a bad line stops with one error naming it (a corpus is read leniently instead: `_read_jsonl`)."""
    for origin, value, bad in _jsonl_values(path, "re-create it"):
        if isinstance(bad, UnicodeDecodeError):
            raise SiftError(f"{origin}: not valid UTF-8 — convert the file to UTF-8") from bad
        if bad is not None:
            raise SiftError(f"{origin}: invalid JSON ({bad.msg})") from bad
        yield origin, value


def record_document(rec, origin: str, fmt: CorpusFormat) -> Document | Skipped:
    """One JSONL record or Parquet row as a document, or why it cannot be one."""
    if not isinstance(rec, dict):
        return Skipped(origin, "not a JSON object (expected one object per line)")
    missing = [(f, flag) for f, flag in ((fmt.id_field, "--id-field"), (fmt.text_field, "--text-field"))
               if f not in rec]
    if missing:
        fields = " and ".join(repr(f) for f, _ in missing)
        flags = " / ".join(flag for _, flag in missing)
        return Skipped(origin, f"record has no field {fields} (its fields: {', '.join(map(str, rec)) or 'none'})",
                       str(rec[fmt.id_field]) if fmt.id_field in rec else None,
                       remedy=f"set {flags} to the field{'s' if len(missing) > 1 else ''} holding "
                              + " and ".join("the id" if f == fmt.id_field else "the text" for f, _ in missing))
    doc_id = str(rec[fmt.id_field])
    text = rec[fmt.text_field]
    if not doc_id:
        return Skipped(origin, f"empty document id (field {fmt.id_field!r})")
    if not isinstance(text, str):
        return Skipped(origin, f"field {fmt.text_field!r} is not a string", doc_id)
    if not text.strip():
        return Skipped(origin, "empty document", doc_id)
    title = rec.get(fmt.title_field)
    return Document(doc_id, render(fmt, doc_id, text, title if isinstance(title, str) else None), origin)


def _read_jsonl(path: Path, fmt: CorpusFormat) -> Iterator[Document | Skipped]:
    for origin, rec, bad in _jsonl_values(path, "re-create or re-download it"):
        if isinstance(bad, UnicodeDecodeError):
            yield Skipped(origin, f"not valid UTF-8 (byte {bad.start} of the line)", remedy="convert the file to UTF-8")
        elif bad is not None:
            yield Skipped(origin, f"invalid JSON ({bad.msg})")
        else:
            yield record_document(rec, origin, fmt)


def _read_parquet(path: Path, fmt: CorpusFormat) -> Iterator[Document | Skipped]:
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise SiftError(f"{path}: not a readable Parquet file ({exc}) — re-create or re-download it") from exc
    names = pf.schema_arrow.names
    for col, flag in ((fmt.id_field, "--id-field"), (fmt.text_field, "--text-field")):
        if col not in names:
            raise SiftError(f"{path}: no column {col!r} (columns: {', '.join(names)}) — set {flag}")
    cols = [fmt.id_field, fmt.text_field] + ([fmt.title_field] if fmt.title_field in names else [])
    row = 0
    for batch in pf.iter_batches(columns=cols):
        data = batch.to_pydict()
        titles = data.get(fmt.title_field, [None] * batch.num_rows)
        for doc_id, text, title in zip(data[fmt.id_field], data[fmt.text_field], titles):
            origin = f"{path}:row {row}"
            row += 1
            rec = {fmt.title_field: title, fmt.id_field: "" if doc_id is None else doc_id, fmt.text_field: text}
            yield record_document(rec, origin, fmt)
