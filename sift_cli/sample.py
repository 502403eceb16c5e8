"""The built-in sample corpus: documentation of Python standard-library modules, taken from the docstrings of the
Python running sift (so it ships with Python itself and nothing is copied into this repository).

Each document is one module: its docstring, then its public names' docstrings, cut at a paragraph boundary
near `max_chars`. The exact text follows the Python version.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

from .cache import cache_dir

SAMPLE_CORPUS = "builtin:stdlib-docs"
MODULES = ("json", "csv", "argparse", "collections", "itertools", "re", "subprocess", "logging", "heapq",
           "statistics", "random", "shutil", "tempfile", "difflib", "textwrap", "contextlib")


@dataclass(frozen=True)
class SampleQuestion:
    """A question whose answer is in the sample documents: the documents to retrieve (the one that answers it
    first), the question, the module that answers it, and the tokens the bundled SmolLM2 needs to say it ("The
    module subprocess.")."""
    doc_ids: tuple[str, ...]
    question: str
    answer: str
    max_new_tokens: int


# Chosen for answers the bundled SmolLM2 gets right with full recompute (checked on Python 3.11's docstrings);
# `sift demo-prefill` asks the first two.
SAMPLE_QUESTIONS = (
    SampleQuestion(("subprocess", "logging"), "Which module runs a command in a new process?", "subprocess", 6),
    SampleQuestion(("statistics", "random"), "Which module calculates the mean and median of numeric data?",
                   "statistics", 6),
    SampleQuestion(("heapq", "collections"), "Which module implements the heap queue algorithm?", "heapq", 8),
)


def module_text(name: str, max_chars: int) -> str:
    mod = importlib.import_module(name)
    parts = [f"The Python module {name}.", inspect.getdoc(mod) or ""]
    public = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
    for attr in sorted(public):
        obj = getattr(mod, attr, None)
        if obj is None or getattr(obj, "__module__", None) != mod.__name__:
            continue
        doc = inspect.getdoc(obj)
        if doc:
            parts.append(f"{name}.{attr}: {doc}")
    text = ""
    for part in filter(None, parts):
        for para in part.split("\n\n"):
            if len(text) + len(para) > max_chars and text:
                return text.strip()
            text += para.strip() + "\n\n"
    return text.strip()


def sample_documents(max_chars: int = 4000) -> list[tuple[str, str]]:
    return [(name, module_text(name, max_chars)) for name in MODULES]


def write_sample_corpus(directory: str | Path, max_chars: int = 4000) -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for doc_id, text in sample_documents(max_chars):
        (out / f"{doc_id}.txt").write_text(text + "\n", encoding="utf-8")
    return out


def resolve_corpus(corpus: str) -> str:
    """A corpus argument as a path: the built-in sample corpus is written (once per Python version) under the sift
    cache; anything else is returned as it is."""
    if corpus == SAMPLE_CORPUS:
        return str(write_sample_corpus(cache_dir() / "sample-corpus" / f"py{sys.version_info[0]}"
                                                                     f"{sys.version_info[1]}"))
    return corpus
