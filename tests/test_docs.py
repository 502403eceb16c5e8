"""The docs stand alone and their examples run as written.

- No page points to files that are not in the repository (the study and specification the project started
  from live outside it) and every relative link resolves.
- Every ```python block of docs/*.md runs on the bundled SmolLM2 on a CPU, the blocks of a page in order and
  sharing their names, in a folder holding `corpus/` (three sample documents: heapq, collections, itertools, cut
  short so that the test stays quick).
- Every ```sh block names only real `sift` commands and options; the blocks not marked `sh illustrative` (those
  that need no GPU, cluster or other data) run with bash after the Python blocks, in the same folder, where
  `shards/` (made by python-api.md's example) is also `demo-shards/`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
OUTSIDE = ("STUDY.md", "SPEC §", "SPEC.md", "H200.md", "../shared", "shared/data")


def blocks(lang: str):
    """(page, line, illustrative, code) of every fenced block whose info string starts with `lang`."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            info = m.group(1).split()
            if info and info[0] == lang:
                yield page, text[:m.start()].count("\n") + 1, "illustrative" in info[1:], m.group(2)


def test_docs_point_to_nothing_outside_the_repository():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for word in OUTSIDE:
            assert word not in text, f"{page.name} mentions {word!r}: say it in the docs' own words"
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def _sift_commands(code: str):
    """Every `sift ...` command line of a shell block, as tokens (continuations joined, pipes and lists split,
    `{a,b}` alternatives expanded, [optional] brackets dropped)."""
    code = code.replace("\\\n", " ")
    for line in code.splitlines():
        line = line.split(" #", 1)[0].strip()
        for part in re.split(r"\|\||&&|;|\|(?![^{]*\})", line):
            words = part.replace("[", " ").replace("]", " ").split()
            if "sift" not in words:
                continue
            words = words[words.index("sift") + 1:]
            variants = [[]]
            for w in words:
                m = re.fullmatch(r"\{(.+)\}", w)
                variants = [v + [alt] for v in variants for alt in (m.group(1).split(",") if m else [w])]
            yield from variants


def test_sh_blocks_name_real_commands_and_options():
    from sift_cli.cli import app

    root = typer.main.get_command(app)
    checked = 0
    for page, line, _, code in blocks("sh"):
        for words in _sift_commands(code):
            cmd, ctx_words = root, []
            while hasattr(cmd, "commands") and words and words[0] in cmd.commands:
                cmd = cmd.commands[words[0]]
                ctx_words.append(words.pop(0))
            where = f"{page.name}:{line}: sift {' '.join(ctx_words)}"
            assert not hasattr(cmd, "commands"), f"{where}: no such command {words[:1]}"
            known = {o for p in cmd.params for o in p.opts + p.secondary_opts}
            for w in words:
                if w.startswith("--"):
                    assert w.split("=")[0] in known, f"{where}: no option {w}"
            checked += 1
    assert checked > 20


def _corpus(folder: Path) -> None:
    from sift_cli.sample import module_text

    (folder / "corpus").mkdir()
    for name in ("heapq", "collections", "itertools"):
        (folder / "corpus" / f"{name}.txt").write_text(module_text(name, 700) + "\n", encoding="utf-8")


@pytest.mark.slow
@pytest.mark.heavy
def test_doc_examples_run(tmp_path, monkeypatch):
    _corpus(tmp_path)
    monkeypatch.chdir(tmp_path)
    ran = []
    for page in PAGES:
        namespace: dict = {"__name__": f"docs_{page.stem}"}
        for p, line, illustrative, code in blocks("python"):
            if p != page or illustrative:
                continue
            try:
                exec(compile(code, f"{page.name}:{line}", "exec"), namespace)
            except Exception as exc:  # say which block, then fail with its traceback
                raise AssertionError(f"{page.name}:{line}: the example fails: {exc!r}") from exc
            ran.append(f"{page.name}:{line}")
    assert (tmp_path / "shards" / "manifest.parquet").is_file() and len(ran) >= 4, ran

    (tmp_path / "demo-shards").symlink_to(tmp_path / "shards")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "SIFT_DEBUG": ""}
    for page, line, illustrative, code in blocks("sh"):
        if illustrative:
            continue
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f"{page.name}:{line}: exit {r.returncode}\n{shlex.quote(code)}\n{r.stderr[-2000:]}"
        ran.append(f"{page.name}:{line}")
    assert sum(r.startswith("cli.md") for r in ran) >= 4, ran
