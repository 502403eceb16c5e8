"""Assemble an online prompt from profiled documents (SPEC §2): prefix ‖ doc_1 ‖ … ‖ doc_n ‖ suffix, by
concatenating stored token ids, after checking that the model and tokenizer are the ones the shards were made
with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import SiftError
from .job import tokenizer_info
from .layout import PromptBits, PromptLayout
from .models import DEFAULT_INSTRUCTION, LoadedModel, suffix_token_ids
from .shards import ShardSet


@dataclass
class Prompt:
    input_ids: list[int]
    layout: PromptLayout
    bits: PromptBits
    doc_ids: list[str]
    query: str

    def segment_tokens(self) -> dict:
        return {"prefix": self.layout.prefix_len, "docs": [d.n_tokens for d in self.layout.docs],
                "suffix": self.layout.suffix_len, "total": self.layout.seq_len}


def check_model_matches(shards: ShardSet, lm: LoadedModel) -> None:
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


def read_doc_ids(path: str | Path) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise SiftError(f"docs file not found: {path}")
    try:
        ids = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as exc:
        raise SiftError(f"{path}: not valid UTF-8") from exc
    ids = [i for i in ids if i and not i.startswith("#")]
    if not ids:
        raise SiftError(f"{path}: no document ids (one per line)")
    return ids


def read_query(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise SiftError(f"query file not found: {path}")
    try:
        text = p.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError as exc:
        raise SiftError(f"{path}: not valid UTF-8") from exc
    if not text:
        raise SiftError(f"{path}: the query is empty")
    return text


def assemble(shards: ShardSet, lm: LoadedModel, doc_ids: list[str], query: str,
             instruction: str = DEFAULT_INSTRUCTION) -> Prompt:
    if not doc_ids:
        raise SiftError("no documents given")
    if not query.strip():
        raise SiftError("the query is empty")
    check_model_matches(shards, lm)
    records = shards.get(doc_ids)
    prefix = shards.prefix_token_ids
    suffix = suffix_token_ids(lm.tokenizer, query, instruction)
    ids = list(prefix)
    for r in records:
        ids.extend(r.tokens)
    ids.extend(suffix)
    if len(ids) > lm.max_context:
        raise SiftError(f"the prompt has {len(ids)} tokens, more than the model's context of {lm.max_context}; "
                        f"retrieve fewer documents")
    layout = PromptLayout.build(len(prefix), doc_ids, [len(r.tokens) for r in records], len(suffix))
    bits = PromptBits.pack(layout, [r.la_bits for r in records], [r.ca_bits for r in records], shards.tile,
                           lm.n_layers, lm.n_heads)
    return Prompt(ids, layout, bits, list(doc_ids), query)
