"""Every command that writes checks its output before it starts (:func:`vlp.inputs.check_output`, called by
:func:`vlp.steps.common.run_step` and ``vlp tracking sync``): an output that is a file, lies under a file, is a
link to nothing, holds a symbolic link or may not be written is exit 2 and one line that names it, and nothing is
written; a query's ``--index`` (or model, or frames) that is a file is refused the same way."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vlp.cli import build_parser, main
from vlp.inputs import check_output

ROOT = Path(__file__).resolve().parents[1]
X = "no-such-input"  # the inputs are never read: the output is checked first
# every command that writes, by its words on the command line, with its arguments around OUT
WRITERS: dict[str, list[str]] = {
    "data synth": ["--out", "OUT"],
    "tracking sync": ["OUT"],
    "fetch": ["--source", X, "--out", "OUT"],
    "fetch --part": ["--source", X, "--out", "OUT", "--part", "1/2"],
    "ingest": ["--source", X, "--out", "OUT"],
    "ingest --part": ["--source", X, "--out", "OUT", "--part", "0/2"],
    "extract-frames": ["--dataset", X, "--out", "OUT"],
    "extract-frames --part": ["--dataset", X, "--out", "OUT", "--part", "0/2"],
    "pretrain-prompter": ["--dataset", X, "--frames", X, "--out", "OUT"],
    "build-prompt-bank": ["--prompter", X, "--entities", X, "--out", "OUT"],
    "pretrain": ["--dataset", X, "--frames", X, "--out", "OUT"],
    "mine-entities": ["--dataset", X, "--out", "OUT"],
    "import-checkpoint": ["--source", X, "--out", "OUT"],
    "finetune-retrieval": ["--dataset", X, "--frames", X, "--out", "OUT"],
    "finetune-qa": ["--dataset", X, "--frames", X, "--pretrained", X, "--out", "OUT"],
    "evaluate-retrieval": ["--dataset", X, "--frames", X, "--model", X, "--out", "OUT"],
    "evaluate-qa": ["--dataset", X, "--frames", X, "--model", X, "--out", "OUT"],
    "index": ["--model", X, "--frames", X, "--out", "OUT"],
}


def argv(writer: str, out: Path | str) -> list[str]:
    words = writer.split(" --")[0].split()
    return [*words, *(str(out) if a == "OUT" else a for a in WRITERS[writer])]


def commands_with_an_output() -> set[str]:
    """Every (sub)command of the parser with an ``out`` argument, by its words (``data synth``)."""
    found: set[str] = set()
    pending: list[tuple[str, argparse.ArgumentParser]] = [("", build_parser())]
    while pending:
        words, parser = pending.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending += [(f"{words} {name}".strip(), sub) for name, sub in action.choices.items()]
            elif action.dest == "out":
                found.add(words)
    return found


def test_the_table_names_every_command_that_writes():
    assert {writer.split(" --")[0] for writer in WRITERS} == commands_with_an_output()


def a_file(tmp: Path) -> tuple[Path, str]:
    (tmp / "f").write_text("not a directory\n")
    return tmp / "f", "is a file: pass a directory, or move the file away"


def under_a_file(tmp: Path) -> tuple[Path, str]:
    (tmp / "f").write_text("not a directory\n")
    return tmp / "f" / "out", f"lies under {tmp / 'f'}, which is a file: pass a path under a directory"


def a_link_to_nothing(tmp: Path) -> tuple[Path, str]:
    (tmp / "out").symlink_to(tmp / "gone")
    return tmp / "out", f"is a symbolic link to {tmp / 'gone'}, which does not exist: remove the link"


def under_a_link_to_nothing(tmp: Path) -> tuple[Path, str]:
    (tmp / "runs").symlink_to(tmp / "gone")
    return tmp / "runs" / "out", f"lies under {tmp / 'runs'}, which is a symbolic link to {tmp / 'gone'}, which does"


def holding_a_link(tmp: Path) -> tuple[Path, str]:
    (tmp / "out").mkdir()
    (tmp / "elsewhere").mkdir()
    (tmp / "out" / "shards").symlink_to(tmp / "elsewhere")
    return tmp / "out", f"holds a symbolic link, shards -> {tmp / 'elsewhere'}: vlp never writes one there"


CASES: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "a file": a_file,
    "under a file": under_a_file,
    "a link to nothing": a_link_to_nothing,
    "under a link to nothing": under_a_link_to_nothing,
    "holding a link": holding_a_link,
}


def listing(tmp: Path) -> dict[str, str | bytes | None]:
    """Every path under ``tmp``: a link's target, a file's bytes, None for a directory."""

    def what(p: Path) -> str | bytes | None:
        return os.readlink(p) if p.is_symlink() else None if p.is_dir() else p.read_bytes()

    return {str(p.relative_to(tmp)): what(p) for p in sorted(tmp.rglob("*"))}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("writer", WRITERS)
def test_an_output_that_cannot_be_written_is_exit_2_with_one_line_naming_it(writer, case, tmp_path, capsys):
    out, said = CASES[case](tmp_path)
    before = listing(tmp_path)
    assert main(argv(writer, out)) == 2
    err = capsys.readouterr().err
    command = writer.split()[0]  # `vlp data synth` says `vlp data:`
    assert err.startswith(f"vlp {command}: error: the output {out} ") and said in err and err.count("\n") == 1, err
    assert listing(tmp_path) == before  # nothing was written, and no part folder made


def test_what_a_step_may_write_passes(tmp_path):
    """A new path below directories yet to be made, a directory, one that is a link to a directory (the caller's
    own argument, as for the readers) and an ``s3://`` prefix (left to the store, asked nothing) all pass."""
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    for out in (tmp_path / "a" / "b" / "c", tmp_path / "real", tmp_path / "alias", "s3://no-such-bucket/x"):
        check_output(str(out))
    with contextlib.chdir(tmp_path):
        check_output("relative/out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias", "real"]  # the check makes nothing


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    """Run the body with nobody's effective user and group (65534) when this process is root, who may write any
    directory; else as it is. The CLI's modules are imported beforehand (root's interpreter is not nobody's)."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def locked() -> Iterator[Path]:
    """A directory that only its owner (root, or the user the tests run as) may enter, not write, in a folder
    anyone may enter (``tmp_path``'s parents are root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="vlp-locked-"))
    top.chmod(0o755)
    (top / "locked").mkdir(mode=0o555)
    try:
        yield top / "locked"
    finally:
        (top / "locked").chmod(0o755)
        shutil.rmtree(top)


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("inside", [False, True], ids=["the output", "its parent"])
def test_an_output_this_user_may_not_write_is_exit_2_with_one_line(writer, inside, locked, capsys):
    out = locked / "new" if inside else locked
    file = locked.parent / "f"
    file.write_text("not a directory\n")
    assert main(argv(writer, file)) == 2  # refused as this user: the command's modules are imported now
    capsys.readouterr()
    with as_nobody():
        code = main(argv(writer, out))
    err = capsys.readouterr().err
    assert code == 2, err
    said = f"is made in {locked}, which this user may not write" if inside else "is a directory this user may not"
    assert said in err and "pass a directory it can write to, or change its permissions" in err, err
    assert err.startswith(f"vlp {writer.split()[0]}: error: the output {out} ") and err.count("\n") == 1
    assert not (locked / "new").exists() and not list(locked.iterdir())


QUERIES = {  # a query command with a directory it reads given as the file F
    "search --index": ["search", "--index", "F", "a red ball"],
    "serve --index": ["serve", "--index", "F", "--port", "0"],
    "serve --qa-model": ["serve", "--index", X, "--qa-model", "F", "--port", "0"],
    "answer --index": ["answer", "--model", X, "--index", "F", "v0", "what colour is it?"],
    "answer --frames": ["answer", "--model", X, "--frames", "F", "v0", "what colour is it?"],
    "answer --model": ["answer", "--model", "F", "--frames", X, "v0", "what colour is it?"],
}


@pytest.mark.parametrize("query", QUERIES)
def test_a_query_directory_that_is_a_file_is_exit_2_with_one_line(query, tmp_path, capsys):
    file = tmp_path / "f"
    file.write_text("not a directory\n")
    assert main([str(file) if a == "F" else a for a in QUERIES[query]]) == 2
    err = capsys.readouterr().err
    command, flag = query.split()
    assert err.startswith(f"vlp {command}: error: {flag} {file} is a file, not a directory: pass ")
    assert err.count("\n") == 1 and listing(tmp_path) == {"f": b"not a directory\n"}


def test_the_cli_process_refuses_a_file_output_and_index_with_one_line(tmp_path):
    """The finding as it was seen: a traceback (exit 1) for a file given as ``--out`` or ``--index``."""
    file = tmp_path / "f"
    file.write_text("not a directory\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    said = {
        "extract-frames": f"vlp extract-frames: error: the output {file} is a file: pass a directory",
        "search": f"vlp search: error: --index {file} is a file, not a directory: pass the output of `vlp index`",
    }
    for args in (["extract-frames", "--dataset", X, "--out", str(file)], ["search", "--index", str(file), "q"]):
        done = subprocess.run([sys.executable, "-m", "vlp.cli", *args], capture_output=True, text=True, timeout=120,
                              env=env, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(said[args[0]]), done.stderr


def test_links_are_looked_for_where_a_step_writes_through_a_name(tmp_path):
    """The output's own entries and those of its folders (``metrics.jsonl``, ``checkpoints/step-N``, ``videos/<xx>``,
    ``shards/*``) may not be links; the files below those are not listed (each is written by an atomic rename, which
    replaces a link), so a fetch output of millions of videos is not walked at every start."""
    from vlp import storage

    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    (out / "videos" / "ab").mkdir(parents=True)
    (out / "videos" / "ab" / "deep.mp4").symlink_to(outside / "x.mp4")  # depth 3: not looked for
    check_output(str(out))
    with pytest.raises(storage.LinkError, match=re.escape("holds a symbolic link, videos/ab/deep.mp4")):
        storage.refuse_links(str(out), "frames store")  # a reader looks everywhere
    for shallow in ("metrics.jsonl", "videos/cd", "shards/s.parquet"):
        (out / shallow).parent.mkdir(parents=True, exist_ok=True)
        (out / shallow).symlink_to(outside)
        with pytest.raises(storage.LinkError, match=re.escape(f"holds a symbolic link, {shallow} -> ")):
            check_output(str(out))
        (out / shallow).unlink()
