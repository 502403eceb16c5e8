"""The three wings (docs/architecture.md): the library never imports the CLI or the lab, the lab never imports the
CLI, and the library's modules import each other without a cycle. Read from the source with `ast`, so imports
inside functions count too."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sift_cli"
CLI, LAB = "sift_cli.cli", "sift_cli.lab"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Absolute names of the sift_cli modules `path` imports (`from pkg import mod` counts as importing pkg.mod)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "sift_cli")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "sift_cli":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.add(sub if module_path(sub) else target)
    for target in list(found):  # importing a.b.c runs a.b's __init__ first (unless a.b holds the importer)
        parts = target.split(".")
        found.update(p for p in (".".join(parts[:i]) for i in range(2, len(parts)))
                     if not (name == p or name.startswith(p + ".")))
    return found


def module_path(name: str) -> Path | None:
    p = PACKAGE.parent.joinpath(*name.split("."))
    for candidate in (p.with_suffix(".py"), p / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


MODULES = {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def wing(name: str) -> str:
    if name == CLI or name.startswith(CLI + ".") or name == "sift_cli.__main__":  # `python -m sift_cli` is the CLI
        return "cli"
    if name == LAB or name.startswith(LAB + "."):
        return "lab"
    return "library"


def test_the_modules_are_found():
    assert {"sift_cli.profile.job", "sift_cli.cli.profile", "sift_cli.lab.eval.qa"} <= MODULES.keys()
    assert MODULES["sift_cli.profile.job"] and all(wing(m) == "library" for m in MODULES["sift_cli.profile.job"])


@pytest.mark.parametrize("importer,forbidden", [("library", {"cli", "lab"}), ("lab", {"cli"})])
def test_no_import_against_the_wings(importer, forbidden):
    bad = sorted(f"{m} imports {t}" for m, targets in MODULES.items() if wing(m) == importer
                 for t in targets if wing(t) in forbidden)
    assert not bad, "\n".join(bad)


def test_no_import_cycle_among_library_modules():
    graph = {m: {t for t in targets if wing(t) == "library" and t in MODULES and t != m}
             for m, targets in MODULES.items() if wing(m) == "library"}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " → ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_every_package_is_listed_for_installation():
    """pyproject.toml names its packages one by one: a new package left out works in an editable install and is
    missing from a wheel."""
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert on_disk - listed == set()
