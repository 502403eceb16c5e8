"""The demo's questions: the bundled SmolLM2 answers them right with full recompute, within the tokens the demo
generates (so `make demo` shows the answer, not a cut sentence)."""

import pytest
import torch

from sift_cli.corpus import CorpusFormat, render
from sift_cli.prefill.generate import greedy_generate
from sift_cli.prefill.run import dense_prefill
from sift_cli.sample import SAMPLE_QUESTIONS, sample_documents
from sift_cli.tokens import prefix_token_ids, suffix_token_ids


@pytest.mark.slow
@pytest.mark.parametrize("q", SAMPLE_QUESTIONS[:2], ids=lambda q: q.answer)
def test_demo_questions_are_answered(q, smol_cpu):
    lm = smol_cpu
    texts = dict(sample_documents())
    ids = list(prefix_token_ids(lm.tokenizer))
    for d in q.doc_ids:  # as `sift profile` reads the sample corpus: one .txt file each, no title
        ids += lm.tokenizer(render(CorpusFormat(), d, texts[d] + "\n", None), add_special_tokens=False)["input_ids"]
    ids += suffix_token_ids(lm.tokenizer, q.question)
    run = dense_prefill(lm, torch.tensor([ids]))
    answer = lm.tokenizer.decode(greedy_generate(lm, run.logits, run.past, q.max_new_tokens), skip_special_tokens=True)
    assert q.answer in answer and answer.strip().endswith("."), answer
