"""scripts/testmap.py (which test files touch a module: `make test-module`, `make mutation`) and the parts of
scripts/mutation.py that do not need mutmut."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # mutation.py imports testmap by name
    spec.loader.exec_module(module)
    return module


testmap = load("testmap")


def names(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


QA = ["src/vlp/eval/qa.py", "vlp/eval/qa.py", "vlp.eval.qa", str(ROOT / "src/vlp/eval/qa.py")]


@pytest.mark.parametrize("arg", QA)
def test_a_module_is_named_by_its_file_or_its_dotted_name(arg: str) -> None:
    assert testmap.module_name(arg) == "vlp.eval.qa"


def test_a_package_is_named_by_its_folder_or_init() -> None:
    assert testmap.module_name("src/vlp/losses/__init__.py") == testmap.module_name("src/vlp/losses") == "vlp.losses"
    assert testmap.module_name("components/_runtime.py") == "components._runtime"


@pytest.mark.parametrize("arg", ["numpy.linalg", "README.md", "tests/test_losses.py"])
def test_anything_but_a_module_of_ours_is_refused(arg: str) -> None:
    with pytest.raises(SystemExit, match="not a module of vlp"):
        testmap.module_name(arg)


def test_direct_importers_only_with_direct() -> None:
    assert names(testmap.touching("vlp.data.sampling", direct=True)) == ["test_sampling.py"]


def test_the_closure_follows_package_inits_and_imports_inside_functions() -> None:
    # vlp.data.ingest's __init__ imports write, which imports validate: a test of ingest touches validate
    assert "vlp.data.ingest.validate" in testmap.closure("vlp.data.ingest")
    assert testmap.closure("vlp.data.sampling") == {"vlp", "vlp.data", "vlp.data.sampling"}
    touching = names(testmap.touching("vlp.data.ingest.validate"))
    assert "test_ingest.py" in touching and "test_hostile_inputs.py" in touching
    # a test file whose imports never reach ingest: the pure metric tests
    assert "test_eval_qa.py" not in touching and "test_losses.py" not in touching


def test_the_command_prints_the_files_once_for_several_modules(capsys) -> None:
    assert testmap.main(["vlp.data.sampling", "src/vlp/data/sampling.py", "--direct"]) == 0
    assert capsys.readouterr().out.split() == ["tests/test_sampling.py"]
    with pytest.raises(SystemExit, match=r"no module vlp\.nothing"):
        testmap.main(["vlp.nothing"])


def test_mutants_are_scored_against_their_target() -> None:
    mutation = load("mutation")
    assert mutation.target_of("vlp.eval.qa.x_qa_metrics__mutmut_3") == "eval.qa"
    assert mutation.target_of("vlp.losses.mlm.x_mask_tokens__mutmut_12") == "losses"
    assert mutation.target_of("vlp.train.checkpoint.xǁCheckpointerǁsave__mutmut_1") == "train.checkpoint"
    with pytest.raises(ValueError, match="none of"):
        mutation.target_of("vlp.report.x_summary__mutmut_1")
    # every target's files exist, and the selected tests are test files that touch them (none excluded)
    for files in mutation.TARGETS.values():
        assert files and all((ROOT / f).is_file() for f in files)
    selected = mutation.selected_tests(["data.sampling"])
    assert "tests/test_sampling.py" in selected and not set(selected) & set(mutation.EXCLUDED_TESTS)


def test_every_equivalent_mutant_has_its_change_and_reason() -> None:
    """scripts/mutation_equivalent.toml parses (a mutant listed twice does not), and each entry names a mutant of
    a target with the diff it was judged on and why no test can tell it from the code."""
    mutation = load("mutation")
    entries = mutation.load_equivalent()
    assert entries
    for name, entry in entries.items():
        assert mutation.target_of(name) in mutation.TARGETS
        assert set(entry) == {"change", "why"}, name
        lines = entry["change"].strip().splitlines()
        assert any(x.startswith("-") for x in lines) and any(x.startswith("+") for x in lines), name
        assert len(entry["why"]) > 20, name


def test_a_later_run_of_some_mutants_replaces_only_their_results() -> None:
    """--base: an earlier run's statuses, overridden by the mutants a --names run reached; the ones it did not run
    ('not checked' there) keep their earlier result, and a mutant new in the later run is added."""
    mutation = load("mutation")
    base = {"a": "survived", "b": "killed", "c": "not checked", "d": "segfault"}
    later = {"a": "killed", "b": "not checked", "c": "survived", "d": "not checked", "e": "not checked"}
    assert mutation.merged(base, later) == {
        "a": "killed",
        "b": "killed",
        "c": "survived",
        "d": "segfault",
        "e": "not checked",
    }


def test_the_mutants_copy_gets_the_layer_contracts_some_tests_read() -> None:
    """scripts/mutation.py writes its own pyproject.toml for the mutants' copy; the import-linter tables go into it
    whole, as the repository's (tests/test_docs.py and tests/test_layers.py read them)."""
    import tomllib

    mutation = load("mutation")
    mine = tomllib.loads(mutation._importlinter_tables())["tool"]["importlinter"]
    assert mine == tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_hung_mutant_run_is_found_and_a_busy_one_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog of scripts/mutation.py picks the mutant runs (their process title is ``mutmut: <mutant>``)
    that have sat nearly idle for IDLE_S, and leaves a working one alone."""
    import subprocess
    import time

    mutation = load("mutation")
    monkeypatch.setattr(mutation, "IDLE_S", 1.0)
    hung = subprocess.Popen(["bash", "-c", 'exec -a "mutmut: vlp.fake.hung" sleep 30'])
    busy = subprocess.Popen(["bash", "-c", 'exec -a "mutmut: vlp.fake.busy" python3 -c "while True: pass"'])
    try:
        time.sleep(2.5)
        found = mutation.idle_mutants()
        assert str(hung.pid) in found and str(busy.pid) not in found
    finally:
        hung.kill()
        busy.kill()
        hung.wait()
        busy.wait()
