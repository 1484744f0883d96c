"""scripts/test_durations.py (each test file's time from pytest's --durations=0 report -> tests/durations.json) and the
order tests/conftest.py gives the files from it: the longest first."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import DURATIONS, longest_first

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("test_durations_script", ROOT / "scripts" / "test_durations.py")
test_durations = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_durations)

# Two test files: the first collected is the fast one, so a JSON in collection order is not longest first. The slow
# one's setup, call and teardown sleep 0.3, 0.5 and 0.2 s: a total that leaves one out is under 1.0 s.
FAST = "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n"
SLOW = """import time

import pytest


@pytest.fixture
def slow_fixture():
    time.sleep(0.3)
    yield
    time.sleep(0.2)


def test_sleeps(slow_fixture):
    time.sleep(0.5)
"""


def run_pytest(folder: Path, *args: str) -> str:
    """pytest's output for the two files of ``folder``, in a child process (its own rootdir, no inherited options)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--durations=0", *args]
    proc = subprocess.run(
        [*cmd, "test_a_fast.py", "test_b_slow.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The real output of ``pytest --durations=0 -vv`` and of ``pytest --durations=0 -q`` on the two files."""
    folder = tmp_path_factory.mktemp("durations")
    (folder / "test_a_fast.py").write_text(FAST)
    (folder / "test_b_slow.py").write_text(SLOW)
    return {"vv": run_pytest(folder, "-vv"), "q": run_pytest(folder, "-q")}


def script(args: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "test_durations.py"), *args],
        input=stdin, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_json_lists_each_file_longest_first_with_setup_call_and_teardown_added(reports, tmp_path):
    log = tmp_path / "pytest.log"
    log.write_text(reports["vv"])
    out = tmp_path / "durations.json"
    proc = script([str(log), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # -vv: nothing hidden
    text = out.read_text()
    seconds = json.loads(text)
    assert list(seconds) == ["test_b_slow.py", "test_a_fast.py"]
    printed = [
        float(re.search(rf"^([\d.]+)s {when}\s+test_b_slow\.py::test_sleeps$", reports["vv"], re.M)[1])
        for when in ("setup", "call", "teardown")
    ]
    assert printed[0] >= 0.3 and printed[1] >= 0.5 and printed[2] >= 0.2, printed
    assert seconds["test_b_slow.py"] == round(sum(printed), 1) >= 1.0
    assert seconds["test_a_fast.py"] < 0.3
    assert text == json.dumps(seconds, indent=2) + "\n"


def test_stdin_and_stdout_and_the_rows_pytest_hides(reports):
    """``-q`` hides the rows under 0.005 s (the fast file's, the slow one's are kept): the script counts what it gets
    and says how many pytest left out."""
    proc = script(["--out", "-"], stdin=reports["q"])
    assert proc.returncode == 0, proc.stderr
    seconds = json.loads(proc.stdout)
    assert list(seconds) == ["test_b_slow.py"] and seconds["test_b_slow.py"] >= 1.0
    hidden = int(re.search(r"^\((\d+) durations < ", reports["q"], re.M)[1])
    assert hidden >= 6  # the fast file's 2 tests x 3 phases
    assert f"pytest hid {hidden} durations" in proc.stderr


def test_a_log_without_a_durations_report_is_refused(tmp_path):
    log = tmp_path / "pytest.log"
    log.write_text("..\n2 passed in 0.01s\n")
    proc = script([str(log), "--out", str(tmp_path / "out.json")])
    assert proc.returncode == 1
    assert "--durations=0" in proc.stderr and not (tmp_path / "out.json").exists()


def item(path: str, name: str) -> SimpleNamespace:
    return SimpleNamespace(path=Path("tests") / path, name=name)


def test_conftest_runs_the_longest_files_first_and_the_unknown_ones_last_in_their_order():
    items = [
        item("test_a.py", "a1"),
        item("test_a.py", "a2"),
        item("test_c.py", "c1"),
        item("test_b.py", "b1"),
        item("test_c.py", "c2"),
        item("test_d.py", "d1"),
        item("test_e.py", "e1"),
        item("test_e.py", "e2"),
    ]
    longest_first(items, {"test_b.py": 5.0, "test_e.py": 9.5, "test_a.py": 0.1})
    assert [i.name for i in items] == ["e1", "e2", "b1", "a1", "a2", "c1", "c2", "d1"]


def test_the_committed_durations_name_test_files_longest_first():
    """tests/durations.json is what the script writes: test files of tests/, longest first, to 0.1 s."""
    seconds = json.loads(DURATIONS.read_text(encoding="utf-8"))
    assert seconds, "tests/durations.json is empty"
    missing = [name for name in seconds if not (DURATIONS.parent / name).is_file()]
    assert not missing, f"tests/durations.json names files tests/ lacks (regenerate it): {missing}"
    assert list(seconds.items()) == list(test_durations.ranked(seconds).items())
