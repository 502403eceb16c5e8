"""Token ids: documents, and the prompt's fixed prefix and per-query suffix from the model's chat template (SPEC §2);
the tokenizer's identity, as shards record it."""

from __future__ import annotations

import contextlib
import hashlib
import os

from .corpus import Document
from .errors import SiftError

DEFAULT_INSTRUCTION = "Answer the question based on the given documents. Only give the answer.\nQuestion: "
_SENTINEL = "\x00SIFT_USER_CONTENT\x00"


def tokenizer_info(tokenizer) -> dict:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    blob = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return {"class": type(tokenizer).__name__, "vocab_size": len(tokenizer),
            "sha256": hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]}


@contextlib.contextmanager
def _temporary_env(name: str, value: str):
    """Set an environment variable for the duration of a block, then restore (or remove) it."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def tokenize_documents(tokenizer, docs: list[Document], chunk: int = 4096) -> list[list[int]]:
    """Token ids of each document; a fast tokenizer encodes each chunk on all cores (the profile job does not fork
    afterwards, so the fork-safety default of TOKENIZERS_PARALLELISM=false is lifted for the call)."""
    out = []
    with _temporary_env("TOKENIZERS_PARALLELISM", "true"):
        for i in range(0, len(docs), chunk):
            enc = tokenizer([d.text for d in docs[i: i + chunk]], add_special_tokens=False)
            out.extend(list(ids) for ids in enc["input_ids"])
    return out


# ---- prompt pieces (SPEC §2) -----------------------------------------------------------------------------------

def _template_halves(tokenizer) -> tuple[str, str] | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                         add_generation_prompt=True)
    if _SENTINEL not in text:
        return None
    before, after = text.split(_SENTINEL, 1)
    return before, after


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prefix_token_ids(tokenizer, prefix_text: str | None = None) -> list[int]:
    """Token ids of everything before the documents: the chat template up to the user content (or given text).

    A BOS token is prepended when the tokenizer would add one and the text does not already start with it.
    """
    if prefix_text is None:
        halves = _template_halves(tokenizer)
        prefix_text = halves[0] if halves else ""
    ids = encode(tokenizer, prefix_text)
    bos = getattr(tokenizer, "bos_token_id", None)
    adds_bos = getattr(tokenizer, "add_bos_token", None)
    if bos is not None and adds_bos and (not ids or ids[0] != bos):
        ids = [bos] + ids
    if not ids:
        raise SiftError("the prompt prefix is empty: the model has no chat template and no BOS token; "
                        "pass --prefix-text")
    return ids


def suffix_token_ids(tokenizer, query: str, instruction: str = DEFAULT_INSTRUCTION) -> list[int]:
    """The query and the template's closing of the user turn + opening of the assistant turn."""
    halves = _template_halves(tokenizer)
    closing = halves[1] if halves else "\nAnswer:"
    return encode(tokenizer, instruction + query + closing)
