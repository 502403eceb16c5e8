import pytest

from sift_cli.corpus import Document
from sift_cli.lab.eval.prompt_sets import PromptSet, PromptSpec

from ...helpers import TRAINING_TEXT


def _docs(n=6):
    out = {}
    for i in range(n):
        text = " ".join(TRAINING_TEXT[(i + j) % len(TRAINING_TEXT)] for j in range(1 + (i * 3) % 5))
        out[f"d{i}"] = Document(f"d{i}", text + "\n\n", "test")
    return out


@pytest.fixture
def tiny_docs():
    """Six short documents of real prose, already rendered."""
    return _docs()


@pytest.fixture(scope="module")
def pset():
    docs = _docs()
    return PromptSet("tiny", docs, [PromptSpec(("d0", "d3", "d5", "d1"), "What jumps over the dog?", ("fox",)),
                                    PromptSpec(("d4", "d2"), "Who judges my vow?", ("sphinx",))])
