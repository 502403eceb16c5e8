"""The generated tables of the docs' pages: the text between `<!-- table:NAME -->` and `<!-- /table:NAME -->` is
what `published.TABLES[NAME]` renders from its committed result (or "not yet re-measured"), preceded by where the
numbers come from (file, command, commit, device, date, protocol)."""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import SiftError
from ..results import read_result
from .published import TABLES, Published

MARKER = re.compile(r"(<!-- table:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /table:(?P=name) -->)", re.S)


def _protocol(p) -> str:
    """A result's protocol in words: its description, or its fields (the timing rule's kind first, unset ones left
    out) as `warm median, repeat 3, warmup 1`."""
    if isinstance(p, dict):
        if p.get("description"):
            return p["description"]
        parts = [str(p["protocol"]).replace("_", " ")] if p.get("protocol") else []
        parts += [f"{k.replace('_', ' ')} {v}" for k, v in p.items() if k != "protocol" and v is not None]
        return ", ".join(parts)
    return str(p) if p else ""


def _provenance(name: str, res: dict) -> str:
    protocol = _protocol(res.get("protocol"))
    return (f"From [`results/{name}`](results/{name}): `{res.get('command')}` at commit "
            f"`{res.get('commit') or 'unknown'}` on {res.get('device') or 'an unnamed device'}, "
            f"{res.get('date') or 'undated'}." + (" **A CPU smoke run: its timings mean nothing.**"
                                                   if res.get("cpu_smoke") else "")
            + (f" Protocol: {protocol}." if protocol else ""))


def block(pub: Published, results: Path) -> str:
    """The generated text of one table (ends with a newline): where each committed result of it comes from, then
    the table of all their rows."""
    found = [(name, read_result(results / name)) for name in pub.results if (results / name).is_file()]
    if not found:
        return f"*Not yet re-measured.* Produced by `{pub.command}`.\n"
    merged = {**found[0][1], "rows": [r for _, res in found for r in res["rows"]],
              "results": [res for _, res in found]}
    return "\n\n".join(_provenance(n, res) for n, res in found) + "\n\n" + pub.render(merged) + "\n"


def render_page(text: str, results: Path, where: str = "page") -> str:
    def sub(m):
        name = m.group("name")
        if name not in TABLES:
            raise SiftError(f"{where}: unknown table marker {name!r} (known: {', '.join(sorted(TABLES))})")
        return m.group(1) + block(TABLES[name], results) + m.group(4)

    return MARKER.sub(sub, text)


def update(docs: Path, results: Path | None = None, check: bool = False) -> list[str]:
    """Render every marked table of docs/*.md from `results` (default docs/results); the pages whose tables
    differ from it. check: write nothing (what the docs-tables test asks)."""
    results = results or docs / "results"
    stale = []
    for page in sorted(Path(docs).glob("*.md")):
        text = page.read_text(encoding="utf-8")
        new = render_page(text, results, page.name)
        if new != text:
            stale.append(page.name)
            if not check:
                page.write_text(new, encoding="utf-8")
    return stale


def marked_tables(docs: Path) -> dict[str, list[str]]:
    """page name → the table names it marks."""
    return {p.name: [m.group("name") for m in MARKER.finditer(p.read_text(encoding="utf-8"))]
            for p in sorted(Path(docs).glob("*.md"))}
