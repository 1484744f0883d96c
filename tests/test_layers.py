"""The import structure of vlp (ARCHITECTURE.md): no circle anywhere, and the layer rule in pyproject.toml's
``[tool.importlinter]`` holds and would catch a back edge (``make lint`` runs import-linter on the same contracts)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """vlp's imports as they run: function-level ones included, those under TYPE_CHECKING (annotations) left out."""
    return grimp.build_graph("vlp", exclude_type_checking_imports=True, cache_dir=None)


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.find_modules_directly_imported_by(module)):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def layer_violations(graph: grimp.ImportGraph) -> list[str]:
    """Direct imports from a layer to one above it that the layers contract does not list in its ``ignore_imports``
    (import-linter also follows indirect chains; a direct edge is what a change adds)."""
    contract = next(c for c in CONFIG["contracts"] if c["type"] == "layers")
    layers = [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]
    rank = {name: len(layers) - i for i, layer in enumerate(layers) for name in layer}  # higher = above

    def rank_of(module: str) -> int | None:
        parts = module.split(".")
        return next((rank[".".join(parts[:n])] for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in rank), None)

    def ignored(importer: str, imported: str) -> bool:
        for rule in contract.get("ignore_imports", []):
            src, _, dst = (x.strip() for x in rule.partition("->"))
            if fnmatch.fnmatchcase(importer, src) and fnmatch.fnmatchcase(imported, dst):
                return True
        return False

    bad = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            low, high = rank_of(importer), rank_of(imported)
            if low is not None and high is not None and high > low and not ignored(importer, imported):
                bad.append(f"{importer} -> {imported}")
    return bad


def test_no_import_circle_anywhere_in_vlp(graph: grimp.ImportGraph) -> None:
    assert circles(graph) == []


def test_a_circle_is_found() -> None:
    """The check above can fail: a graph with a circle of three, and a fourth module outside it."""
    made = grimp.ImportGraph()
    for importer, imported in [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]:
        made.add_import(importer=importer, imported=imported)
    assert circles(made) == [["a", "b", "c"]]


def test_every_layer_imports_only_from_below(graph: grimp.ImportGraph) -> None:
    assert layer_violations(graph) == []


def test_a_new_back_edge_breaks_the_layer_rule() -> None:
    """What `make lint` would refuse: the frames store importing a step, and the config importing the models."""
    graph = grimp.build_graph("vlp", exclude_type_checking_imports=True, cache_dir=None)
    graph.add_import(importer="vlp.data.frames", imported="vlp.steps.common")
    graph.add_import(importer="vlp.config", imported="vlp.models.family")
    assert layer_violations(graph) == ["vlp.config -> vlp.models.family", "vlp.data.frames -> vlp.steps.common"]


def test_every_vlp_module_is_in_a_layer(graph: grimp.ImportGraph) -> None:
    """A new top-level module must be given its place in the rule, else nothing checks its imports."""
    contract = next(c for c in CONFIG["contracts"] if c["type"] == "layers")
    placed = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    top = {".".join(m.split(".")[:2]) for m in graph.modules if m != "vlp"}
    assert sorted(top - placed) == []


def test_serving_reaches_no_step(graph: grimp.ImportGraph) -> None:
    """``vlp search``, ``answer`` and ``serve`` run the model as the evaluation steps do (:mod:`vlp.inference`) but
    import no step, not even through another module: the serving image need not carry the training code."""
    for serving in ("vlp.serve", "vlp.index.query", "vlp.index.answer", "vlp.index.store", "vlp.index.pyfunc"):
        assert not graph.chain_exists(importer=serving, imported="vlp.steps", as_packages=True), serving
