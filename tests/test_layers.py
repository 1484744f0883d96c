"""The import structure of vlp (ARCHITECTURE.md): no circle anywhere, and the layer rule in pyproject.toml's
``[tool.importlinter]`` holds and would catch a back edge (``make lint`` runs import-linter on the same contracts)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


@pytest.fixture
def graph() -> grimp.ImportGraph:
    """vlp's imports as they run (a fresh graph: tests change theirs): function-level ones included, those under
    TYPE_CHECKING (annotations) left out."""
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


def contract(kind: str) -> dict:
    return next(c for c in CONFIG["contracts"] if c["type"] == kind)


def band(text: str) -> grimp.Layer:
    """One band of the layers contract, ``a : b``: names that may import each other."""
    return grimp.Layer(*(n.strip() for n in text.split(":")), independent=False)


def layer_violations(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    """``(importer layer, imported layer)`` of every import (direct or through other modules) that goes up the
    layers contract."""
    found = graph.find_illegal_dependencies_for_layers(layers=[band(one) for one in contract("layers")["layers"]])
    return {(d.importer, d.imported) for d in found}


def test_no_import_circle_anywhere_in_vlp(graph: grimp.ImportGraph) -> None:
    assert circles(graph) == []


def test_a_circle_is_found() -> None:
    """The check above can fail: a graph with a circle of three, and a fourth module outside it."""
    made = grimp.ImportGraph()
    for importer, imported in [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]:
        made.add_import(importer=importer, imported=imported)
    assert circles(made) == [["a", "b", "c"]]


def test_every_layer_imports_only_from_below(graph: grimp.ImportGraph) -> None:
    assert layer_violations(graph) == set()


def test_no_contract_lists_an_exception() -> None:
    """The back edges found when the rule was written are gone: a new one must be fixed, not listed."""
    assert [c["name"] for c in CONFIG["contracts"] if c.get("ignore_imports")] == []


def test_a_new_back_edge_breaks_the_layer_rule() -> None:
    """What `make lint` would refuse: the frames store importing a step, a family importing the training loop, and
    a foundation importing the config; two names of one band may import each other."""
    graph = grimp.build_graph("vlp", exclude_type_checking_imports=True, cache_dir=None)
    graph.add_import(importer="vlp.data.frames", imported="vlp.steps.common")
    graph.add_import(importer="vlp.models.alpro.model", imported="vlp.train.loop")
    graph.add_import(importer="vlp.storage.base", imported="vlp.config")
    graph.add_import(importer="vlp.inference", imported="vlp.train.loop")  # the same band
    assert layer_violations(graph) == {
        ("vlp.data", "vlp.steps"),
        ("vlp.models", "vlp.train"),
        ("vlp.storage", "vlp.config"),
    }


def test_the_layer_rule_has_five_bands() -> None:
    """Each band is a sentence in ARCHITECTURE.md: interfaces, steps, what steps call, data and models, foundations."""
    assert len(contract("layers")["layers"]) == 5


def test_every_vlp_module_is_in_a_layer(graph: grimp.ImportGraph) -> None:
    """A new top-level module must be given its place in the rule, else nothing checks its imports."""
    placed = {name.strip() for layer in contract("layers")["layers"] for name in layer.split(":")}
    top = {".".join(m.split(".")[:2]) for m in graph.modules if m != "vlp"}
    assert sorted(top - placed) == []


def forbidden_imports(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    """``(source, forbidden)`` of every forbidden contract ``graph`` breaks, checked as import-linter checks it: a
    chain through any module, or a direct import where the contract allows indirect ones."""
    found = set()
    for one in (c for c in CONFIG["contracts"] if c["type"] == "forbidden"):
        for source in one["source_modules"]:
            for target in one["forbidden_modules"]:
                if one.get("allow_indirect_imports"):
                    broken = graph.find_matching_direct_imports(import_expression=f"{source}.** -> {target}.**")
                else:
                    broken = graph.chain_exists(importer=source, imported=target, as_packages=True)
                if broken:
                    found.add((source, target))
    return found


def test_every_forbidden_import_is_absent(graph: grimp.ImportGraph) -> None:
    """Serving (``vlp search``, ``answer``, ``serve``) reaches no step and no training code, not even through
    another module; the data code no model, metric or config code; the metrics no rendering; a family no other
    family's package directly (the registry it reads imports every family's spec)."""
    assert forbidden_imports(graph) == set()


def test_a_forbidden_import_is_found() -> None:
    """The check above can fail: ALPRO's model importing ALBEF's, the pure metrics importing the reports, and the
    search page reaching the training loop through the query code."""
    graph = grimp.build_graph("vlp", exclude_type_checking_imports=True, cache_dir=None)
    graph.add_import(importer="vlp.models.alpro.model", imported="vlp.models.albef.queue")
    graph.add_import(importer="vlp.eval.qa", imported="vlp.report")
    graph.add_import(importer="vlp.index.query", imported="vlp.train.loop")
    assert forbidden_imports(graph) == {
        ("vlp.models.alpro", "vlp.models.albef"),
        ("vlp.eval", "vlp.report"),
        ("vlp.index", "vlp.train"),
        ("vlp.serve", "vlp.train"),
    }


def unexplained_function_imports(source: str) -> list[int]:
    """The lines of ``source``'s function-level imports of vlp that no comment explains: a comment on the line,
    or on the lines right above the run of imports it belongs to."""
    lines = source.splitlines()
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if isinstance(node, ast.Import):
                module = node.names[0].name
            if not module or not (module == "vlp" or module.startswith("vlp.")) or "#" in lines[node.lineno - 1]:
                continue
            above = node.lineno - 2
            while above >= 0 and re.match(r"\s*(from \S+ import|import )", lines[above]):
                above -= 1
            if above < 0 or not lines[above].strip().startswith("#"):
                found.append(node.lineno)
    return sorted(set(found))


def test_every_function_level_import_says_why() -> None:
    """An import inside a function hides an edge of the graph from a reader: each one says why it is not at the top
    (what it keeps out of a light path, e.g. torch out of the data steps)."""
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "src" / "vlp").rglob("*.py"))
             if (lines := unexplained_function_imports(p.read_text(encoding="utf-8")))}  # fmt: skip
    assert found == {}


def test_an_unexplained_function_import_is_found() -> None:
    source = """
def a():
    from vlp import storage  # here: a reason
def b():
    # here: a reason for both
    from vlp import storage
    from vlp.data import manifest
def c():
    x = 1
    from vlp.data import manifest
    import json
def d():
    import vlp.text
"""
    assert unexplained_function_imports(source) == [10, 13]


def test_reading_a_model_kind_imports_that_family_alone() -> None:
    """``of_kind`` (every model directory read: search, serve, evaluate) finds the family by the kinds its spec
    declares, as the lists of kinds a step reads are made: in a fresh interpreter, TS2-Net's kind imports TS2-Net's
    model code and neither ALPRO's nor ALBEF's."""
    code = ("import sys; from vlp import registry, inference; registry.of_kind('ts2net_retrieval'); "
            "inference.retrieval_kinds(); inference.qa_kinds(); print(sorted(m for m in sys.modules "
            "if m.endswith('.model') and m.startswith('vlp.models.')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['vlp.models.ts2net.model']"


@pytest.mark.parametrize("name", ["ts2net", "alpro", "albef"])
def test_a_search_loads_its_familys_code_alone_and_neither_transformers_nor_timm(name) -> None:
    """What ``vlp search`` imports to encode a query with a family's model (the query code, the family's model code,
    a model built, a trained tokenizer's ids): not the other families, not transformers or timm (vlp's own layers
    and ``tokenizers`` alone; each pulled ``torch._dynamo``), not MLflow, spaCy, KServe or FastAPI."""
    others = [f"vlp.models.{other}.model" for other in ("ts2net", "alpro", "albef") if other != name]
    heavy = ("timm", "transformers", "torch._dynamo", *others, "mlflow", "spacy", "kserve", "fastapi")
    code = f"""
import sys, tempfile
import vlp.index.query, vlp.inference
from vlp.models import family
from vlp.models.tokenizer import load_text_ids, save_tokenizer, train_wordpiece
from vlp.settings import ModelConfig
vlp.inference.retrieval_kinds()
fam = family.get({name!r})
bank = 4 if "bank" in family.spec({name!r}).pretrain_inputs else 0
cfg = fam.config(ModelConfig(family={name!r}, preset="tiny", img_size=32, num_frames=2, max_len=24), 300, bank)
fam.build(fam.kinds.retrieval, cfg)
with tempfile.TemporaryDirectory() as tmp:
    save_tokenizer(train_wordpiece(["a red circle", "a blue star"], vocab_size=50), tmp)
    loaded = [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]
    for m in loaded:  # training and saving a tokenizer needs transformers; loading one for a search must not
        del sys.modules[m]
    load_text_ids(tmp)(["a red star"], max_length=8)
print([m for m in {heavy!r} if m in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_help_page_imports_torch_or_what_a_command_needs() -> None:
    """``vlp --help`` and every subcommand's help, in one interpreter, import none of what the commands need to run
    (torch, transformers, timm, MLflow, LanceDB, spaCy, KServe, FastAPI): the CLI's dispatch imports a command's
    step when it runs. A help page that imported them would cost seconds; the test fails naming what it pulled."""
    heavy = ("torch", "transformers", "timm", "mlflow", "lancedb", "spacy", "kserve", "fastapi", "aiohttp", "kfp")
    code = f"""
import contextlib, io, sys
from vlp import cli
parser = cli.build_parser()
commands = [a for a in parser._subparsers._group_actions[0].choices]
pages = [[]] + [[c] for c in commands] + [["data", "synth"], ["tracking", "sync"]]
for page in pages:
    with contextlib.redirect_stdout(io.StringIO()) as shown:
        try:
            cli.main([*page, "--help"])
        except SystemExit:
            pass
    assert "usage: vlp" in shown.getvalue(), page
print(len(pages), [m for m in {heavy!r} if m in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    count, pulled = out.split(" ", 1)
    assert int(count) > 18 and pulled.strip() == "[]", out
