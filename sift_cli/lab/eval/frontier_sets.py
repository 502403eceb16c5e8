"""The prompt sets the frontier is measured on (`sift eval frontier`): essays, NQ with 10 and 20 passages, and
NQ question pairs (two gold passages per prompt among distractors: an answer needs both)."""

from __future__ import annotations

import random
from pathlib import Path

from ...errors import SiftError
from ..datasets import data_dir, essay_records, long_essays, nq_records
from .prompt_sets import ESSAY_QUESTIONS, PromptSet, PromptSpec, nq_prompt_set, render_records

FRONTIER_SETS = ("essays", "nq10", "nq20", "pairs")


def essay_sample_set(data: str | Path | None, n_prompts: int, docs_per_prompt: int = 3, words: int = 1000,
                     seed: int = 0) -> PromptSet:
    """`n_prompts` prompts of `docs_per_prompt` essays each (their first `words` words), sampled with a seed
    from the essays that long: prompts may share essays, so there are as many as asked."""
    records = long_essays(essay_records(data_dir(data), words=words), words)
    if len(records) < docs_per_prompt:
        raise SiftError(f"only {len(records)} essays have {words} words; need {docs_per_prompt}")
    rng = random.Random(seed)
    prompts = [PromptSpec(tuple(r["id"] for r in rng.sample(records, docs_per_prompt)),
                          ESSAY_QUESTIONS[i % len(ESSAY_QUESTIONS)]) for i in range(n_prompts)]
    return PromptSet(f"essays{docs_per_prompt}x{words}", render_records(records), prompts,
                     source=f"paul-graham-essays, {docs_per_prompt} of the first {words} words, seed {seed}")


def nq_pairs_set(data: str | Path | None, n_prompts: int, n_docs: int = 10, seed: int = 0) -> PromptSet:
    """Prompts of two NQ questions asked together, both gold passages placed at random among n_docs - 2 other
    questions' gold passages; the answers are both questions' (a prompt needs two passages to be answered)."""
    records = nq_records(data_dir(data))
    if n_docs < 2 or len(records) < n_docs + 2:
        raise SiftError(f"NQ pairs need at least 2 passages per prompt and {n_docs + 2} questions")
    rng = random.Random(seed)
    prompts, used = [], set()
    for _ in range(n_prompts):
        a, b = rng.sample(range(len(records)), 2)
        others = rng.sample([i for i in range(len(records)) if i not in (a, b)], n_docs - 2)
        order = others + [a, b]
        rng.shuffle(order)
        used.update(order)
        question = f"{records[a]['question'].rstrip('?')}? And {records[b]['question'].rstrip('?')}?"
        answers = (f"{records[a]['answers'][0]} / {records[b]['answers'][0]}",)
        prompts.append(PromptSpec(tuple(f"nq{i:05d}" for i in order), question, answers))
    docs = render_records([{"id": f"nq{i:05d}", "title": records[i]["ctxs"][0].get("title", ""),
                            "text": records[i]["ctxs"][0]["text"]} for i in sorted(used)])
    return PromptSet(f"pairs{n_docs}", docs, prompts, source=f"nq-open-oracle question pairs, {n_docs} passages, "
                                                            f"seed {seed}")


def frontier_set(name: str, data, n_prompts: int, seed: int = 0, essay_words: int = 1000) -> PromptSet:
    if name == "essays":
        return essay_sample_set(data, n_prompts, words=essay_words, seed=seed)
    if name in ("nq10", "nq20"):
        return nq_prompt_set(data, int(name[2:]), n_prompts, seed)
    if name == "pairs":
        return nq_pairs_set(data, n_prompts, seed=seed)
    raise SiftError(f"--sets: unknown set {name!r}; choose from {', '.join(FRONTIER_SETS)}")
