"""The README, docs/README.md (the index) and the pages under docs/ say what the repo has and does.

Checked here: the README stays a five-minute read (under 8,000 bytes); every repo path, ``make`` target and
relative link they name exists; every ``vlp`` and ``python -m pipelines.local_run`` command line in their fenced
blocks parses; every ``make pipeline-run PARAMS="..."`` parameter is one the compiled pipeline takes; and every
annotation example ingests, with the real ``vlp ingest`` on real mp4 clips, to the rows and splits it claims.

Annotation examples (docs/guides/own-videos.md, README.md) follow one convention:

- ``<!-- example: file=PATH [clips=A,B,...] [format=F] -->`` on the line before a fenced block marks that block as
  the content of ``PATH`` (relative to the folder the commands run from). A ``python`` block is run there
  instead (it writes ``PATH`` itself). Each clip in ``clips`` (same folder) is a real 2 s h264 mp4.
- After it, before the next marker, the first fenced line ``vlp ingest --source PATH ...`` (any prefix such as
  ``.venv/bin/``) is run through ``vlp.cli.main`` from that folder; its summary must name format ``F``.
- The first line after the marker that starts with ``Ingested:`` lists what the output holds, per table and split:
  ``Ingested: videos train 2 / test 1; captions train 3 / test 1; QA none.`` (a ``(N rejected)`` after a table
  counts its rejects; a table not named has no rows).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import put

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*/*.md"))  # docs/guides, docs/reference, docs/results
INDEX = ROOT / "docs" / "README.md"  # the docs' index page
PAGES = [README, INDEX, ROOT / "ARCHITECTURE.md", ROOT / "benchmarks" / "README.md", *DOCS]
TOP_DIRS = ("docs", "src", "configs", "pipelines", "benchmarks", "tests", "scripts", "helm", "docker",
            "components", "requirements", "mk")  # fmt: skip
# Paths the docs name on purpose although the repo has no such file: a copy the reader makes.
HYPOTHETICAL = {"pipelines/config/mine.yaml"}


FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.M | re.S)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block."""
    return [(m["lang"], m["body"]) for m in FENCE.finditer(text)]


def command_lines(text: str) -> list[str]:
    """The lines of every ```bash / ```sh block, continuation lines joined, comments cut."""
    lines = []
    for lang, body in fenced_blocks(text):
        if lang not in ("bash", "sh"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def code_text(text: str) -> str:
    """Everything in inline code spans and fenced blocks."""
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))
    return "\n".join(spans + [body for _, body in fenced_blocks(text)])


def make_targets() -> set[str]:
    targets: set[str] = set()
    for mk in [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))]:
        for line in mk.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*:(?![=])", line)
            if m and not line.startswith((".PHONY", "\t")):
                targets.update(m[1].split())
    return targets


def test_readme_is_a_five_minute_read():
    size = len(README.read_bytes())
    assert size < 8000, f"README.md is {size} bytes; move detail into docs/ (limit 8,000)"


def test_the_architecture_page_is_a_map_not_a_manual():
    """ARCHITECTURE.md names every top-level module of vlp that the layer rule places, in at most 6,000 characters."""
    text = (README.parent / "ARCHITECTURE.md").read_text()
    assert len(text) <= 6000, f"ARCHITECTURE.md is {len(text)} characters (limit 6,000)"
    layers = tomllib.loads((README.parent / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    names = {name.strip() for layer in layers["layers"] for name in layer.split(":")}
    assert sorted(n for n in names if f"`{n}`" not in text) == []


def test_the_docs_index_names_every_page_and_the_readme_names_the_index():
    """docs/README.md links every page of docs/guides, docs/reference and docs/results, and only those; a page of
    another folder under docs/ would be outside the three kinds."""
    named = set(re.findall(r"\]\(((?:guides|reference|results)/[\w.-]+\.md)\)", INDEX.read_text(encoding="utf-8")))
    assert named == {p.relative_to(ROOT / "docs").as_posix() for p in DOCS}, "docs/README.md must list every page"
    assert {p.parent.name for p in DOCS} == {"guides", "reference", "results"}
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md")) == ["README.md"]
    assert "](docs/README.md)" in README.read_text(encoding="utf-8")


def test_generated_pages_say_so():
    """A page a command writes says which command, at its top (the index marks it generated too)."""
    index = INDEX.read_text(encoding="utf-8")
    for name in ("ablation", "ablation-albef", "ablation-ts2net", "pretrained-start"):
        head = (ROOT / "docs" / "results" / f"{name}.md").read_text(encoding="utf-8")[:400]
        assert "Generated by" in head and "do not edit by hand" in head, name
        assert re.search(rf"results/{name}\.md\) \(\*generated\* by", index), name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_repo_path_named_exists(page: Path):
    missing = []
    pattern = rf"(?<![\w./$<-])((?:{'|'.join(TOP_DIRS)})/[\w./*-]*)"
    for path in re.findall(pattern, code_text(page.read_text(encoding="utf-8"))):
        path = path.rstrip(".,:")
        if path in HYPOTHETICAL:
            continue
        if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
            missing.append(path)
    assert not missing, f"{page.name} names paths the repo lacks: {sorted(set(missing))}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_make_target_named_exists(page: Path):
    named = set(re.findall(r"(?<![\w-])make ([a-z][\w-]*)(?![\w=])", code_text(page.read_text(encoding="utf-8"))))
    if page == README:
        assert {"pipeline-run", "test"} <= named, "the README's two commands are missing (or the pattern broke)"
    assert not named - make_targets(), f"{page.name} names make targets that do not exist: {named - make_targets()}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path):
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)
            if anchor not in {slug(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{page.name} has links that resolve to nothing: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_line_parses(page: Path):
    from pipelines import local_run
    from pipelines.submit import parse_params
    from vlp.cli import build_parser

    for line in command_lines(page.read_text(encoding="utf-8")):
        words = shlex.split(line)
        if words[0].endswith("vlp") and words[0] in ("vlp", ".venv/bin/vlp"):
            try:
                build_parser().parse_args(words[1:])
            except SystemExit:
                pytest.fail(f"{page.name}: `{line}` is not a valid vlp command line")
        if words[:3] in (["python", "-m", "pipelines.local_run"], [".venv/bin/python", "-m", "pipelines.local_run"]):
            try:
                local_run.parse_args(words[3:])
            except SystemExit:
                pytest.fail(f"{page.name}: `{line}` is not a valid pipelines.local_run command line")
        if words[:2] == ["make", "pipeline-run"]:
            settings = dict(w.split("=", 1) for w in words[2:] if "=" in w)
            family = settings.get("FAMILY", "ts2net" if settings.get("PIPELINE") == "retrieval" else "alpro")
            name = settings.get("PIPELINE", "pretrain")  # as mk/pipeline.mk's RUN_PIPELINE picks it
            name = name if name in ("retrieval", "index") or family == "alpro" else f"pretrain-{family}"
            params = parse_params(settings.get("PARAMS", "").split(), ROOT / "pipelines" / "compiled" / f"{name}.yaml")
            assert all(isinstance(v, (str, int, list)) for v in params.values()), line


# --------------------------------------------------------------------------- annotation examples


@dataclass
class Example:
    page: str
    file: str
    clips: list[str]
    fmt: str
    lang: str
    body: str
    command: list[str]
    expected: dict[str, tuple[Counter[str], int]]  # table -> (rows per split, rejected)


def parse_expected(line: str) -> dict[str, tuple[Counter[str], int]]:
    """``Ingested: videos train 2 / test 1; captions train 3 (1 rejected); QA none.`` as a dict."""
    expected = {}
    for part in line.removeprefix("Ingested:").strip().rstrip(".").split(";"):
        words = part.replace("(", " ").replace(")", " ").replace("/", " ").split()
        table = {"videos": "videos", "captions": "captions", "qa": "qa"}[words[0].lower()]
        rejected = 0
        if "rejected" in words:
            rejected = int(words[words.index("rejected") - 1])
            words = words[: words.index("rejected") - 1]
        counts = Counter({words[i]: int(words[i + 1]) for i in range(1, len(words) - 1, 2)})
        expected[table] = (counts, rejected)
    for table in ("videos", "captions", "qa"):
        expected.setdefault(table, (Counter(), 0))
    return expected


def examples() -> list[Example]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        markers = list(re.finditer(r"^<!-- example: (.*?) -->\n", text, re.M))
        for i, marker in enumerate(markers):
            keys = dict(kv.split("=", 1) for kv in marker[1].split())
            rest = text[marker.end() : markers[i + 1].start() if i + 1 < len(markers) else len(text)]
            block = re.match(r"```(\w*)\n(.*?)^```", rest, re.M | re.S)
            assert block, f"{page.name}: the example marker `{marker[0].strip()}` is not right before a fenced block"
            ingest = [ln for ln in command_lines(rest[block.end() :]) if re.search(r"\bvlp ingest --source ", ln)]
            outcome = re.search(r"^Ingested: .*$", rest, re.M)
            assert ingest and outcome, f"{page.name}: example {keys['file']} lacks its vlp ingest line or Ingested:"
            words = shlex.split(ingest[0])
            assert words[words.index("--source") + 1] == keys["file"], f"{page.name}: {ingest[0]} is not {keys['file']}"
            found.append(
                Example(page.name, keys["file"], [c for c in keys.get("clips", "").split(",") if c],
                        keys.get("format", ""), block[1], block[2], words[1:], parse_expected(outcome[0]))
            )  # fmt: skip
    return found


EXAMPLES = examples()


def test_the_examples_cover_every_ingest_format():
    from vlp.data.ingest import FORMATS

    assert {e.fmt for e in EXAMPLES} == set(FORMATS), "docs/guides/own-videos.md needs one worked example per format"
    assert any(e.page == "README.md" for e in EXAMPLES), "the README keeps one short, tested example"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.page}:{e.file}")
def test_annotation_example_ingests_as_documented(example: Example, clip_bytes, tmp_path, monkeypatch):
    from vlp import cli
    from vlp.data import manifest

    monkeypatch.chdir(tmp_path)
    for clip in example.clips:
        put(tmp_path / clip, clip_bytes)
    if example.lang == "python":
        exec(compile(example.body, f"{example.page}:{example.file}", "exec"), {})  # the doc's own script
    else:
        put(tmp_path / example.file, example.body)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = cli.main([*example.command, "ingest.workers=1", "ingest.progress=false"])
    assert code == 0, f"vlp {' '.join(example.command)} exited {code}"
    summary = json.loads(stdout.getvalue())
    assert summary["format"] == example.fmt
    out = example.command[example.command.index("--out") + 1]
    schemas = {"videos": manifest.VIDEO_SCHEMA, "captions": manifest.CAPTION_SCHEMA, "qa": manifest.QA_SCHEMA}
    for table, (splits, rejected) in example.expected.items():
        rows = manifest.read(out, f"{table}.parquet", schemas[table]).to_pylist()
        assert Counter(r["split"] for r in rows) == splits, f"{table}: {Counter(r['split'] for r in rows)}"
        assert summary[table]["rejected"] == rejected, f"{table}: {summary[table]}"


def test_the_families_table_lists_every_registered_family_as_its_spec_says():
    """docs/reference/families.md's table has one row per registered family, with its paper, whether vlp pre-trains
    it, its pipeline and its package, as the registry has them (a family added to the registry and not to the table
    fails here, and so does a row the registry no longer backs)."""
    from pipelines import pretrain, retrieval
    from vlp.models import family

    lines = (ROOT / "docs" / "reference" / "families.md").read_text().splitlines()
    rows = [line for line in lines if re.match(r"\| \w.*\(`\w+`", line)]
    by_name = {re.search(r"\(`(\w+)`", row).group(1): [c.strip() for c in row.strip("|").split("|")] for row in rows}
    assert sorted(by_name) == sorted(family.names())
    for name, (title, paper, pretrained, pipeline, module) in by_name.items():
        spec = family.spec(name)
        assert title.startswith(spec.title) and spec.paper in paper and module == f"`vlp.models.{name}`", name
        assert pretrained.startswith("yes" if spec.pretrains else "no"), name
        dag = pretrain.name_of(name) if spec.pretrains else retrieval.NAME
        assert pipeline.startswith(f"`{dag}`"), (name, pipeline)


# --------------------------------------------------------------------------- claims that drift with the code


def test_every_config_section_has_its_row_in_configuration_md():
    """docs/reference/configuration.md's table has a row for every section of ``vlp.config.Config`` (from the
    dataclass, so a section added to the code and not to the page fails here) naming that section's dataclass, and a
    row for the family sections that names every registered family."""
    import dataclasses
    import typing

    from vlp.config import Config
    from vlp.models import family

    text = (ROOT / "docs" / "reference" / "configuration.md").read_text(encoding="utf-8")
    rows = {name: line for line in text.splitlines() if line.startswith("| `")
            for name in re.findall(r"`([\w.]+)`", line.split("|")[1])}  # fmt: skip
    hints = typing.get_type_hints(Config)
    for section in dataclasses.fields(Config):
        row = rows.get(section.name)
        assert row, f"configuration.md's table has no row for the config section `{section.name}`"
        assert hints[section.name].__name__ in row, f"the `{section.name}` row does not name {hints[section.name]}"
    assert all(f"model.{name}" in rows for name in family.names()), "the family sections' row misses a family"


def test_the_suite_is_counted_and_timed_in_one_place():
    """Only docs/guides/testing.md states how many tests the suite has and how long it takes (a measurement, with
    its machine and date); any count of test files a page states is the tree's."""
    testing = ROOT / "docs" / "guides" / "testing.md"
    suite = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+ (?:tests|passed)\b|\bpytest \d[\d,]* s\b|make test`? took")
    elsewhere = {page.name: suite.findall(page.read_text(encoding="utf-8")) for page in PAGES if page != testing}
    assert not {name: found for name, found in elsewhere.items() if found}, "link to docs/guides/testing.md instead"
    assert suite.search(testing.read_text(encoding="utf-8")), "testing.md gives the suite's time, or the pattern broke"
    files = len(list((ROOT / "tests").glob("test_*.py")))
    for page in PAGES:
        for stated in re.findall(r"(\d[\d,]*) test files", page.read_text(encoding="utf-8")):
            assert int(stated.replace(",", "")) == files, f"{page.name} counts {stated} test files; tests/ has {files}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_is_over_20000_characters(page: Path):
    """A page that grows past this is a page that repeats itself or keeps history: link, or let git keep it."""
    size = len(page.read_text(encoding="utf-8"))
    assert size <= 20000, f"{page.name} is {size:,} characters (limit 20,000)"


def test_pipelines_md_names_every_compiled_pipeline():
    """docs/guides/pipelines.md describes each pipeline of pipelines/compiled/ (a DAG added there and not to the page
    fails here), by the name it has in KFP."""
    text = (ROOT / "docs" / "guides" / "pipelines.md").read_text(encoding="utf-8")
    compiled = sorted(p.stem for p in (ROOT / "pipelines" / "compiled").glob("*.yaml"))
    assert compiled and [name for name in compiled if f"**`vlp-{name}`**" not in text] == []


def test_every_vlp_command_is_documented():
    """Every command of the ``vlp`` CLI (from its parser, so a command added to the code and not to the docs fails
    here) appears as ``vlp <command>`` in docs/reference or docs/guides."""
    import argparse

    from vlp.cli import build_parser

    def commands(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [prefix]
        return [c for a in subs for name, sub in a.choices.items() for c in commands(sub, f"{prefix} {name}")]

    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS if p.parent.name in ("reference", "guides"))
    found = commands(build_parser(), "vlp")
    assert len(found) > 10, found
    assert [c for c in found if f"`{c}" not in text] == [], "document each command (steps.md, or its guide)"
