"""Which test files touch a module: the tests to run after changing it (``make test-module M=...``).

A test file touches module ``M`` when ``M`` is in the closure of what the file imports, following vlp's own imports
(and components/ and pipelines/, which the tests import too) through every ``import`` statement in a file, the ones
inside functions included. That is a static superset of what a change to ``M`` can reach: a test that only reaches
``M`` through a subprocess (``python -m vlp ...``, a KFP local run) is found through the file that starts it only if
that file imports a module which imports ``M``; ``--all-entry`` adds every test that starts ``vlp`` or a pipeline in
a child process.

    python scripts/testmap.py src/vlp/eval/retrieval.py      # or vlp.eval.retrieval
    python scripts/testmap.py --direct vlp.losses             # only the files that import it themselves
"""

from __future__ import annotations

import argparse
import ast
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The packages whose import statements are followed: vlp (under src/) and the repository's top-level packages.
PACKAGES = {"vlp": ROOT / "src" / "vlp", "components": ROOT / "components", "pipelines": ROOT / "pipelines"}
# What marks a test file as one that runs vlp in a child process (the CLI, a step, a KFP local run).
CHILD_MARKERS = ('"-m", "vlp', "'-m', 'vlp", "pipelines.local_run", "kfp.local", "vlp.cli")


def module_name(arg: str) -> str:
    """``src/vlp/eval/retrieval.py``, ``vlp/eval/retrieval.py`` or ``vlp.eval.retrieval`` -> ``vlp.eval.retrieval``."""
    path = Path(arg)
    if arg.endswith(".py") or path.exists():
        resolved = (ROOT / path).resolve() if not path.is_absolute() else path.resolve()
        for base in (ROOT / "src", ROOT):
            try:
                rel = resolved.relative_to(base)
            except ValueError:
                continue
            parts = list(rel.with_suffix("").parts) if rel.suffix == ".py" else list(rel.parts)
            if parts and parts[-1] == "__init__":
                parts.pop()
            if parts and parts[0] in PACKAGES:
                return ".".join(parts)
        raise SystemExit(f"testmap: {arg} is not a module of vlp, components or pipelines")
    name = arg.removesuffix(".py")
    if name.split(".")[0] not in PACKAGES:
        raise SystemExit(f"testmap: {arg} is not a module of vlp, components or pipelines")
    return name


def source_of(name: str) -> Path | None:
    """The file that defines module ``name`` (a package's ``__init__.py``), or None when it is not ours."""
    top, *rest = name.split(".")
    base = PACKAGES.get(top)
    if base is None:
        return None
    path = base.joinpath(*rest)
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return None


@functools.cache
def imported_names(path: Path) -> frozenset[str]:
    """Every module name an import statement in ``path`` names (``from a import b`` names ``a`` and ``a.b``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _package_of(path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the file's package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(n for n in names if n)


def _package_of(path: Path) -> str:
    for top, base in PACKAGES.items():
        try:
            rel = path.resolve().relative_to(base)
        except ValueError:
            continue
        parts = [top, *rel.parent.parts]
        return ".".join(parts)
    return ""


@functools.cache
def closure(name: str) -> frozenset[str]:
    """``name`` and every module of ours it imports, directly or through others (importing ``a.b.c`` runs
    ``a/__init__`` and ``a/b/__init__`` too)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        parts = current.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in seen:
                continue
            src = source_of(prefix)
            if src is None:
                continue
            seen.add(prefix)
            todo.extend(imported_names(src))
    return frozenset(seen)


def test_files(tests_dir: Path = ROOT / "tests") -> list[Path]:
    return sorted(p for p in tests_dir.glob("test_*.py"))


def touching(module: str, *, direct: bool = False, all_entry: bool = False) -> list[Path]:
    """The test files that touch ``module`` (see the module docstring)."""
    if source_of(module) is None:
        raise SystemExit(f"testmap: no module {module} under src/vlp, components or pipelines")
    found = []
    for path in test_files():
        names = imported_names(path)
        if direct:
            hit = any(n == module or n.startswith(module + ".") for n in names)
        else:
            reached: set[str] = set()
            for n in names:
                reached |= closure(n)
            hit = module in reached or any(r.startswith(module + ".") for r in reached)
            if not hit and all_entry:
                text = path.read_text(encoding="utf-8")
                hit = any(marker in text for marker in CHILD_MARKERS)
        if hit:
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="+", help="a module's file (src/vlp/eval/qa.py) or dotted name (vlp.eval.qa)")
    parser.add_argument("--direct", action="store_true", help="only test files that import the module themselves")
    parser.add_argument("--all-entry", action="store_true", help="add the tests that run vlp in a child process")
    args = parser.parse_args(argv)
    files: dict[Path, None] = {}
    for arg in args.modules:
        for path in touching(module_name(arg), direct=args.direct, all_entry=args.all_entry):
            files[path] = None
    print(" ".join(str(p.relative_to(ROOT)) for p in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
