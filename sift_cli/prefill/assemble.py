"""Assemble an online prompt (SPEC §2): prefix ‖ doc_1 ‖ … ‖ doc_n ‖ suffix, by concatenating stored token ids,
after checking that the model and tokenizer are the ones the shards were made with.

A document may also come as text (`corpus.Document`): it is tokenised, and its stored bits are used when a shard
set holds its id with the same tokens; otherwise it is a *dense* document (no bits: computed densely in both
directions, layout.py) and the prompt says why."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..corpus import Document
from ..errors import SiftError
from ..layout import PromptBits, PromptLayout
from ..models import LoadedModel
from ..tokens import DEFAULT_INSTRUCTION, suffix_token_ids, tokenize_documents, tokenizer_info
from .lookup import BitsSource, ShardSource, check_same_kind

NOT_PROFILED = "not profiled"
TEXT_DIFFERS = "its text differs from the profiled one"


@dataclass(frozen=True)
class DenseDocument:
    """A document of the prompt without bits, why, and its text when given (what on-the-fly profiling reads)."""
    doc_id: str
    reason: str  # NOT_PROFILED or TEXT_DIFFERS
    n_tokens: int
    document: Document | None = None


@dataclass
class Prompt:
    input_ids: list[int]
    layout: PromptLayout
    bits: PromptBits
    doc_ids: list[str]
    query: str
    dense: list[DenseDocument] = field(default_factory=list)
    source: BitsSource | None = None  # the sets SIFT's prefill fetches `bits` from again, inside its timing

    def segment_tokens(self) -> dict:
        return {"prefix": self.layout.prefix_len, "docs": [d.n_tokens for d in self.layout.docs],
                "suffix": self.layout.suffix_len, "total": self.layout.seq_len}


def check_model_matches(shards: ShardSource, lm: LoadedModel) -> None:
    meta = shards.meta
    stored = meta["sift.model"]
    if stored.get("config_hash") != lm.config_hash or stored.get("weights") != lm.fingerprint:
        raise SiftError(f"{shards.dir} was profiled with model {stored.get('name')!r} "
                        f"(weights {str(stored.get('weights'))[:24]}…), not {lm.name!r} "
                        f"(weights {lm.fingerprint[:24]}…); pass the same --model the shards were made with")
    if meta["sift.tokenizer"] != tokenizer_info(lm.tokenizer):
        raise SiftError(f"{shards.dir}: the tokenizer differs from the one the shards were profiled with")
    for key, value in (("sift.n_layers", lm.n_layers), ("sift.n_heads", lm.n_heads)):
        if int(meta[key]) != value:
            raise SiftError(f"{shards.dir}: {key} is {meta[key]}, the model has {value}")


def missing_ids_error(sets: list[ShardSource], doc_ids: list[str]) -> SiftError:
    """The error for ids no set holds and no text was given for: why each was skipped at profile time, or that
    no set has it; one line, or a line per id under a count when there are several."""
    lines = []
    for doc_id in doc_ids:
        skipped = next((s for s in sets if s.skip_reason(doc_id) is not None), None)
        if skipped is not None:  # say why it was not profiled
            lines.append(skipped.absent(doc_id))
            continue
        where = (f"the shard set {sets[0].dir}" if len(sets) == 1
                 else f"any of the shard sets {', '.join(str(x.dir) for x in sets)}")
        lines.append(f"doc_id {doc_id!r} is not in {where} and no text was given for it — give the document as a "
                     f"file or a JSONL record, or profile it first")
    if len(lines) == 1:
        return SiftError(lines[0])
    return SiftError(f"{len(lines)} documents of the prompt are not in its shard sets and no text was given for "
                     f"them — give them as files or JSONL records, or profile them first", lines)


def doc_id_of(doc: str | Document) -> str:
    """The id of a prompt document given by id or as text."""
    return doc.doc_id if isinstance(doc, Document) else doc


def build_prompt(lm: LoadedModel, prefix_ids: list[int], doc_ids: list[str], doc_tokens: list[list[int]],
                 la_blobs: list[bytes | None], ca_blobs: list[bytes | None], tile: int, query: str,
                 instruction: str = DEFAULT_INSTRUCTION, allow_long: bool = False,
                 suffix_ids: list[int] | None = None, too_long_hint: str = "") -> Prompt:
    """prefix ‖ docs ‖ suffix from token ids and packed bits (SPEC §2), without re-tokenising; the suffix is the
    query in the chat template unless `suffix_ids` is given; None blobs make a document dense. allow_long: past
    the model's context (evaluations)."""
    suffix = list(suffix_ids) if suffix_ids is not None else suffix_token_ids(lm.tokenizer, query, instruction)
    ids = list(prefix_ids)
    for t in doc_tokens:
        ids.extend(t)
    ids.extend(suffix)
    if len(ids) > lm.max_context and not allow_long:
        raise SiftError(f"the prompt has {len(ids)} tokens, more than the model's context of {lm.max_context}"
                        f"{too_long_hint}")
    layout = PromptLayout.build(len(prefix_ids), list(doc_ids), [len(t) for t in doc_tokens], len(suffix))
    bits = PromptBits.pack(layout, la_blobs, ca_blobs, tile, lm.n_layers, lm.n_heads)
    return Prompt(ids, layout, bits, list(doc_ids), query)


def prompt_from_shards(shards: ShardSource, lm: LoadedModel, doc_ids: list[str], query: str,
                       instruction: str = DEFAULT_INSTRUCTION, allow_long: bool = False,
                       too_long_hint: str = "") -> Prompt:
    """The prompt of `doc_ids` and `query` from a shard set made with this model."""
    check_model_matches(shards, lm)
    records = shards.get(doc_ids)
    prompt = build_prompt(lm, shards.prefix_token_ids, doc_ids, [r.tokens for r in records],
                          [r.la_bits for r in records], [r.ca_bits for r in records], shards.tile, query, instruction,
                          allow_long, too_long_hint=too_long_hint)
    prompt.source = BitsSource(prompt.layout, (shards,) * len(doc_ids), shards.tile, lm.n_layers, lm.n_heads)
    return prompt


def assemble(shards: ShardSource | list[ShardSource], lm: LoadedModel, docs: list[str | Document], query: str,
             instruction: str = DEFAULT_INSTRUCTION) -> Prompt:
    """The online prompt (`sift prefill`): checked documents and query, within the model's context.

    docs: ids (looked up in the shard sets, first holder wins) or texts (`Document`: stored bits when a set holds
    the id with the same tokens, else dense). shards: sets opened by `lookup.open_set` (a `BitStore` or a
    `ShardSet`)."""
    sets = list(shards) if isinstance(shards, (list, tuple)) else [shards]
    if not docs:
        raise SiftError("no documents given")
    if not query.strip():
        raise SiftError("the query is empty — give a question")
    if not sets:
        raise SiftError("no shard set given")
    for s in sets:
        check_model_matches(s, lm)
    check_same_kind(sets)
    first = sets[0]
    ids = [doc_id_of(d) for d in docs]
    found: dict = {}
    holder: dict = {}
    for s in sets:
        got = s.records([i for i in ids if i not in found])
        found.update(got)
        holder.update(dict.fromkeys(got, s))
    texts = [d for d in docs if isinstance(d, Document)]
    text_tokens = dict(zip([d.doc_id for d in texts], tokenize_documents(lm.tokenizer, texts))) if texts else {}
    tokens, la, ca, dense, holders = [], [], [], [], []
    for d, doc_id in zip(docs, ids):
        rec = found.get(doc_id)
        if isinstance(d, Document):
            t = text_tokens[doc_id]
            same = rec is not None and list(rec.tokens) == t
            if not same:
                dense.append(DenseDocument(doc_id, NOT_PROFILED if rec is None else TEXT_DIFFERS, len(t), d))
        else:
            if rec is None:
                raise missing_ids_error(sets, [doc_id])
            t, same = rec.tokens, True
        tokens.append(t)
        la.append(rec.la_bits if same else None)
        ca.append(rec.ca_bits if same else None)
        holders.append(holder[doc_id] if same else None)
    prompt = build_prompt(lm, first.prefix_token_ids, ids, tokens, la, ca, first.tile, query, instruction,
                          too_long_hint="; retrieve fewer documents")
    prompt.dense = dense
    prompt.source = BitsSource(prompt.layout, tuple(holders), first.tile, lm.n_layers, lm.n_heads)
    return prompt
