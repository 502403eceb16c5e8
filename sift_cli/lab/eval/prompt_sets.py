"""What every measurement needs: sets of prompts (documents + question), profiling them into a work directory,
and composing `prefix ‖ docs ‖ suffix` prompts from shards or from in-memory bits.

A `PromptSet` holds documents already rendered with their template (the exact text that is tokenised) and the
prompts built on them. Builders: `nq_prompt_set` (STUDY.md: gold passage among other questions' gold passages),
`essay_prompt_set` (three essays cut to their first 1,600 words), `corpus_prompt_set` (a sample of the user's own
corpus, for `sift calibrate`) and `read_prompt_file` (the user's own prompts over a shard set).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

from ...cache import cache_dir
from ...config import ProfileConfig, resolve_profile_config
from ...corpus import CorpusFormat, Document, json_lines, load_documents, render
from ...errors import SiftError
from ...models import LoadedModel
from ...prefill.assemble import Prompt, prompt_from_shards
from ...prefill.lookup import ShardSource
from ...profile.job import profile_corpus
from ...store.bitstore import BitStore
from ...tokens import DEFAULT_INSTRUCTION, prefix_token_ids, suffix_token_ids, tokenize_documents
from ..datasets import data_dir, essay_records, long_essays, nq_items, nq_passages, nq_records, write_jsonl

ESSAY_QUESTIONS = (
    "What is the main argument of the first essay?",
    "Which of these essays talks about startups, and what does it say about them?",
    "Summarize the last essay in one sentence.",
    "What advice does the author give to the reader?",
    "What do these essays have in common?",
    "What example does the second essay use to make its point?",
)
GENERIC_QUERIES = (
    "Summarize what these documents say.",
    "What is the main topic of the first document?",
    "Which document is the most relevant to the others, and why?",
    "List the key facts stated in the last document.",
)
RAW_TEMPLATE = CorpusFormat(template="{text}")  # documents of a PromptSet are already rendered


@dataclass(frozen=True)
class PromptSpec:
    doc_ids: tuple[str, ...]
    question: str
    answers: tuple[str, ...] = ()
    gold: str | None = None


@dataclass
class PromptSet:
    name: str
    docs: dict[str, Document]  # doc_id → rendered document, in corpus order
    prompts: list[PromptSpec] = field(default_factory=list)
    source: str = ""

    def used_docs(self) -> list[Document]:
        seen: dict[str, Document] = {}
        for p in self.prompts:
            for d in p.doc_ids:
                seen.setdefault(d, self.docs[d])
        return sorted(seen.values(), key=lambda d: d.doc_id)

    def describe(self) -> dict:
        return {"name": self.name, "source": self.source, "prompts": len(self.prompts),
                "documents": len(self.used_docs()),
                "docs_per_prompt": sorted({len(p.doc_ids) for p in self.prompts})}


def render_records(records: list[dict], fmt: CorpusFormat = CorpusFormat()) -> dict[str, Document]:
    """{id, title, text} records → rendered documents (the default template: 'Title: {title}\\n{text}\\n\\n')."""
    out = {}
    for r in records:
        doc_id = str(r["id"])
        out[doc_id] = Document(doc_id, render(fmt, doc_id, r["text"], r.get("title") or None), f"record {doc_id}")
    return out


def nq_prompt_set(data: str | Path | None, n_docs: int, n_prompts: int, seed: int = 0,
                  gold_position: int | None = None) -> PromptSet:
    records = nq_records(data_dir(data))
    items = nq_items(records, n_docs=n_docs, n_items=n_prompts, seed=seed, gold_position=gold_position)
    docs = render_records(nq_passages(records))
    prompts = [PromptSpec(tuple(it.doc_ids), it.question, tuple(it.answers), it.gold) for it in items]
    return PromptSet(f"nq{n_docs}", docs, prompts, source=f"nq-open-oracle, {n_docs} passages, seed {seed}")


def essay_prompt_set(data: str | Path | None, n_prompts: int = 3, docs_per_prompt: int = 3, words: int = 1600,
                     seed: int = 0) -> PromptSet:
    """Prompts of `docs_per_prompt` essays, each cut to its first `words` words (essays shorter than that are
    not used), no title line; prompt i uses essays [i*k, (i+1)*k) of a seeded shuffle, with a generic question."""
    records = long_essays(essay_records(data_dir(data), words=words), words)
    if len(records) < docs_per_prompt:
        raise SiftError(f"only {len(records)} essays have {words} words; need {docs_per_prompt}")
    rng = random.Random(seed)
    order = list(range(len(records)))
    rng.shuffle(order)
    n_prompts = min(n_prompts, len(records) // docs_per_prompt)
    docs = render_records(records)
    prompts = []
    for i in range(n_prompts):
        ids = tuple(records[j]["id"] for j in order[i * docs_per_prompt:(i + 1) * docs_per_prompt])
        prompts.append(PromptSpec(ids, ESSAY_QUESTIONS[i % len(ESSAY_QUESTIONS)]))
    return PromptSet(f"essays{docs_per_prompt}x{words}", docs, prompts,
                     source=f"paul-graham-essays, {docs_per_prompt} × first {words} words, seed {seed}")


def smollm2_real_prompt_sets(data_dir, nq_prompts: int = 2) -> list[tuple[str, PromptSet]]:
    """The real prompts SmolLM2's prefill is measured on (docs/benchmarks.md): one prompt of 2 essays cut to 1,450
    words (about 4K tokens), one of 4 (about 8K), and `nq_prompts` NQ prompts of 20 passages; (name, set) pairs."""
    return [("essays 4K", essay_prompt_set(data_dir, 1, 2, 1450)),
            ("essays 8K", essay_prompt_set(data_dir, 1, 4, 1450)),
            ("NQ 20 passages", nq_prompt_set(data_dir, 20, nq_prompts))]


def smollm2_real_prompts(lm: LoadedModel, data_dir, work: str | Path, nq_prompts: int = 2):
    """(set name, composed Prompt) for every prompt of `smollm2_real_prompt_sets`, each set's documents profiled
    first with `lm` at the device's default thresholds into `work`/<set name> (reused when done)."""
    cfg = resolve_profile_config(lm.device, {}).profile
    for name, pset in smollm2_real_prompt_sets(data_dir, nq_prompts):
        shards = ensure_shards(pset, lm, cfg, Path(work) / name.replace(" ", "_"))
        for spec in pset.prompts:
            yield name, compose(shards, lm, spec)


def builtin_prompt_set(data: str, data_dir, n_docs: int, n_prompts: int, seed: int, docs_per_prompt: int,
                       words: int) -> PromptSet:
    """`--data nq|essays`: the NQ prompts (`n_docs` passages each) or the essay prompts."""
    if data == "nq":
        return nq_prompt_set(data_dir, n_docs, n_prompts, seed)
    if data == "essays":
        return essay_prompt_set(data_dir, n_prompts, docs_per_prompt, words, seed)
    raise SiftError(f"--data {data}: expected nq or essays")


def check_document_count(docs: list[Document], docs_per_prompt: int, source: str) -> None:
    """Refuse a corpus with fewer documents than one prompt takes (callers check it before loading the model)."""
    if len(docs) < docs_per_prompt:
        raise SiftError(f"{source}: {len(docs)} documents, fewer than --docs-per-prompt {docs_per_prompt} — lower "
                        f"--docs-per-prompt")


def corpus_prompt_set(corpus: str | Path | list[Document], fmt: CorpusFormat, n_prompts: int, docs_per_prompt: int,
                      queries: list[str] | None = None, seed: int = 0, lm: LoadedModel | None = None,
                      source: str | None = None) -> PromptSet:
    """Random prompts over the user's own corpus (a path, or its documents already read, then `source` names
    them): `docs_per_prompt` distinct documents each, a query from `queries` (or generic ones).

    With `lm`, every prompt fits the model's context: documents that cannot fit even alone (with the prefix and
    the longest question) are not sampled, and a prompt whose sample would be too long keeps the documents that
    fit, so it has fewer than `docs_per_prompt`. Prompts are checked here, before any model pass."""
    docs = corpus if isinstance(corpus, list) else load_documents(corpus, fmt)
    source = source or (str(corpus) if not isinstance(corpus, list) else "documents")
    check_document_count(docs, docs_per_prompt, source)
    queries = list(queries or GENERIC_QUERIES)
    fits, budget = (lambda ids: True), None
    if lm is not None:
        lengths = dict(zip([d.doc_id for d in docs], map(len, tokenize_documents(lm.tokenizer, docs))))
        budget = lm.max_context - len(prefix_token_ids(lm.tokenizer)) - max(
            len(suffix_token_ids(lm.tokenizer, q)) for q in queries)
        fitting = [d for d in docs if lengths[d.doc_id] <= budget]
        if not fitting:
            raise SiftError(f"{source}: no document fits the model's context of {lm.max_context} tokens with the "
                            f"prompt's prefix and question (the shortest has {min(lengths.values())} tokens) — "
                            f"calibrate on shorter documents, or split them")
        docs = fitting
        fits = lambda ids: sum(lengths[i] for i in ids) <= budget  # noqa: E731
    rng = random.Random(seed)
    prompts = []
    for i in range(n_prompts):
        picked = [docs[j].doc_id for j in rng.sample(range(len(docs)), min(docs_per_prompt, len(docs)))]
        while not fits(picked):  # fewer documents rather than a prompt longer than the context
            picked.pop()
        prompts.append(PromptSpec(tuple(picked), queries[i % len(queries)]))
    return PromptSet("corpus", {d.doc_id: d for d in docs}, prompts, source=source)


def read_prompt_file(path: str | Path) -> list[PromptSpec]:
    """JSONL, one prompt per line: {"doc_ids": [...], "question": "...", "answers": [...] (optional)}."""
    p = Path(path)
    if not p.is_file():
        raise SiftError(f"prompts file not found: {path}")
    out = []
    for origin, rec in json_lines(p):
        if not isinstance(rec, dict) or not rec.get("doc_ids") or not rec.get("question"):
            raise SiftError(f"{origin}: expected {{\"doc_ids\": [...], \"question\": \"...\"}}")
        out.append(PromptSpec(tuple(map(str, rec["doc_ids"])), str(rec["question"]),
                              tuple(map(str, rec.get("answers") or ()))))
    if not out:
        raise SiftError(f"{path}: no prompts")
    return out


# ---- profiling into a work directory -------------------------------------------------------------------------

def model_key(lm: LoadedModel) -> str:
    return hashlib.sha256(f"{lm.fingerprint}|{lm.config_hash}".encode()).hexdigest()[:10]


def default_work_dir(name: str, lm: LoadedModel, cfg: ProfileConfig) -> Path:
    rule = (f"mass-e{cfg.epsilon:g}-c{cfg.ca_epsilon:g}" if cfg.rule == "mass"
            else f"a{cfg.alpha:g}-b{cfg.beta:g}-g{cfg.gamma:g}")
    return cache_dir() / "eval" / f"{name}-{model_key(lm)}-T{cfg.tile}-{rule}"


def ensure_shards(pset: PromptSet, lm: LoadedModel, cfg: ProfileConfig, work: str | Path | None = None,
                  num_shards: int = 8, progress=None) -> BitStore:
    """Profile the documents the prompts use (deduplicated) into `work`/shards; resumable, reused when done. The
    set is read through its serving store, as `sift prefill` reads it (SIFT's timed prefills look bits up there)."""
    work = Path(work) if work else default_work_dir(pset.name, lm, cfg)
    docs = pset.used_docs()
    corpus = write_jsonl([{"id": d.doc_id, "text": d.text} for d in docs], work / "corpus.jsonl")
    out = work / "shards"
    profile_corpus(corpus, out, lm, cfg, RAW_TEMPLATE, num_shards=num_shards, progress=progress)
    shards = BitStore(out)
    missing = shards.missing([d.doc_id for d in docs])
    if missing:
        raise SiftError(f"{len(missing)} documents were not profiled (longer than the model's context?): "
                        f"{', '.join(missing[:3])}")
    return shards


# ---- composing prompts -----------------------------------------------------------------------------------------

def compose(shards: ShardSource, lm: LoadedModel, spec: PromptSpec, instruction: str = DEFAULT_INSTRUCTION,
            allow_long: bool = False) -> Prompt:
    """The online prompt of `spec` from a shard set (`prompt.assemble` without its checks of the inputs)."""
    return prompt_from_shards(shards, lm, list(spec.doc_ids), spec.question, instruction, allow_long)
