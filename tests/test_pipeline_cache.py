"""KFP's cache across runs of the local DAG: its key (the code digest, the data behind source_uri), the tasks never
cached, what kfp.local prints and how an interrupted run ends. A rerun of the main job from the cache is in
test_pipeline_local.py, on the main job's own run."""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipelines import local_run, local_talk

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.yaml")


def ctrl_c_on() -> None:
    """In the child before exec: SIGINT back to its default, so Python installs its Ctrl-C handler even when this
    test runs where SIGINT is ignored (a job started in the background of a non-interactive shell)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_the_cache_key_follows_the_step_configs_text_not_its_path(tmp_path: Path) -> None:
    """The rerun of a whole DAG from KFP's cache is tested on the main job's own run (test_pipeline_local.py)."""
    shutil.copy(TINY, tmp_path / "edited.yaml")
    before = local_run.code_digest(str(tmp_path / "edited.yaml"))
    assert local_run.code_digest(TINY) == before  # the same text elsewhere: the same key
    with open(tmp_path / "edited.yaml", "a", encoding="utf-8") as fh:
        fh.write("\n# edited\n")
    assert local_run.code_digest(str(tmp_path / "edited.yaml")) != before


def test_every_task_gets_the_code_digest_and_run_level_tasks_are_never_cached(tmp_path: Path) -> None:
    """The digest reaches kfp.local's key as an env var of every task (a custom cache key would replace the key,
    dropping the task's inputs); start_run, finish_run and report stay uncached whatever a config says."""
    import dataclasses

    import yaml
    from kfp import compiler

    from pipelines import config as pipeline_config
    from pipelines import pretrain

    cfg = pipeline_config.load(pipeline_config.CONFIG_DIR / "local.yaml")
    for name in pipeline_config.RUN_LEVEL_STEPS:
        cfg.steps[name].caching = True  # a careless pipeline config
    cfg = dataclasses.replace(cfg, code_digest="abc123")
    compiler.Compiler().compile(pretrain.build(cfg), str(tmp_path / "p.yaml"))
    spec = next(yaml.safe_load_all((tmp_path / "p.yaml").read_text(encoding="utf-8")))  # then the platform spec
    for name, executor in spec["deploymentSpec"]["executors"].items():
        env = {e["name"]: e["value"] for e in executor["container"].get("env", [])}
        assert env.get(pipeline_config.CODE_DIGEST_ENV) == "abc123", name
        assert "cacheKey" not in yaml.safe_dump(spec["root"])
    dag = spec["root"]["dag"]["tasks"]
    inner = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    caching = {n: t.get("cachingOptions", {}).get("enableCache", False) for n, t in {**dag, **inner}.items()}
    assert not caching["start-run"] and not caching["report"] and not caching["finish-run"]
    assert caching["pretrain"] and caching["synth"]
    (tmp_path / "bad.yaml").write_text("code_digest: x\n", encoding="utf-8")
    with pytest.raises(Exception, match=r"code_digest is set by pipelines\.local_run"):
        pipeline_config.load(tmp_path / "bad.yaml")


def test_executor_filter_drops_kfp_bookkeeping_and_keeps_the_steps_output() -> None:
    lines = [
        "[KFP Executor 2026-12-02 10:00:00,000 INFO]: Looking for component `synth` in --component_module_path\n",
        "[KFP Executor 2026-12-02 10:00:00,001 INFO]: Got executor_input:\n",
        "{\n",
        '    "inputs": {\n',
        '        "parameterValues": {"config": "x"}\n',
        "    }\n",
        "}\n",
        "synth: 40 clips written\n",
        "[KFP Executor 2026-12-02 10:00:09,000 INFO]: Wrote executor output file to /x/executor_output.json.\n",
        "}\n",  # a step's own line after the dump is kept
    ]
    keep = local_talk.ExecutorFilter().keep
    assert [line for line in lines if keep(line)] == ["synth: 40 clips written\n", "}\n"]


def test_talk_patches_kfp_local_and_restores_it() -> None:
    """Talk wraps kfp.local module functions by name; a kfp release that moves them must fail here."""
    from kfp.local import logging_utils, subprocess_task_handler, task_dispatcher
    from kfp.local.orchestrator import task_executor

    targets = [
        (task_executor, "execute_single_task"),
        (task_dispatcher, "run_single_task_implementation"),
        (subprocess_task_handler, "run_local_subprocess"),
        (logging_utils, "local_logger_context"),
        (logging_utils, "print_horizontal_line"),
    ]
    originals = [getattr(module, name) for module, name in targets]
    printer = builtins.print
    with local_talk.Talk(verbose=False):
        assert all(getattr(m, n) is not o for (m, n), o in zip(targets, originals, strict=True))
        builtins.print = lambda *a, **k: None  # what kfp's indented_print can leave behind (ParallelFor tasks)
    assert [getattr(module, name) for module, name in targets] == originals and builtins.print is printer
    with local_talk.Talk(verbose=True):  # verbose keeps kfp's own log
        assert logging_utils.local_logger_context is originals[3]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_run_says_one_line_and_leaves_no_mlflow_run_running(tmp_path: Path, sig: int, code: int) -> None:
    """SIGTERM to `make pipeline-run`'s process alone (a timeout's kill), or SIGINT to its whole process group (a
    terminal's Ctrl-C), while a training step runs: exit 143 / 130, one line on stderr and no traceback, the step
    process gone, and the MLflow parent run and the step's run KILLED (nothing left RUNNING)."""
    from vlp.tracking import TrackingConfig, client, experiment_id, sqlite_uri

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "pipelines.local_run", "--out", str(out), "--step-config", TINY]
    cmd += ["pretrain.max_steps=100000"]  # the prompter trains until it is stopped
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=ctrl_c_on)  # fmt: skip
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # until the prompter has logged two training steps: it is mid-training
        logged = list(out.glob("kfp/*/pretrain-prompter/prompter/metrics.jsonl"))
        if logged and len(logged[0].read_text(encoding="utf-8").splitlines()) >= 2:
            break
        assert proc.poll() is None, "".join(printed) + proc.stderr.read()
        time.sleep(0.2)
    else:
        pytest.fail("the prompter logged no training step in 10 minutes:\n" + "".join(printed))
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # a terminal sends Ctrl-C to the whole foreground process group
    else:
        proc.send_signal(sig)
    err = proc.stderr.read()
    proc.wait(timeout=120)
    reader.join(timeout=10)
    rest = "".join(printed)
    assert proc.returncode == code, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert lines[-1].startswith("interrupted during pretrain-prompter; "), err
    assert "come from KFP's cache" in lines[-1] and "pretrain-prompter runs again" in lines[-1]
    assert "pretrain-prompter done" not in rest

    # No step process outlives the run (kfp runs `sh -ec ... python -m kfp.dsl.executor_main`: both must go).
    def left() -> list[str]:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                if str(out).encode() in cmdline.read_bytes():
                    found.append(cmdline.parent.name)
        return found

    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left(), f"step processes left running: {left()}"

    cfg = TrackingConfig(tracking_uri=sqlite_uri(out), experiment=local_run.EXPERIMENT)
    runs = client(cfg).search_runs([experiment_id(cfg)])
    status = {r.info.run_name: r.info.status for r in runs}
    assert status.get("pretrain_prompter") == "KILLED", status
    parent = [r for r in runs if r.data.tags.get("vlp.kind") == "pipeline"]
    assert [r.info.status for r in parent] == ["KILLED"], status
    assert "RUNNING" not in status.values(), status


def test_the_local_cache_key_follows_the_data_behind_source_uri(tmp_path: Path) -> None:
    """ingest's cache key holds source_uri as a string; the local run adds a digest of the files behind it, so an
    annotation file or a clip edited in place is ingested again."""
    (tmp_path / "data" / "clips").mkdir(parents=True)
    annotations = tmp_path / "data" / "train.json"
    annotations.write_text('[{"video": "clips/a.mp4", "caption": "a dog"}]', encoding="utf-8")
    (tmp_path / "data" / "clips" / "a.mp4").write_bytes(b"x" * 10)
    folder, file = local_run.source_digest(str(tmp_path / "data")), local_run.source_digest(str(annotations))
    assert folder and file and folder != file
    assert local_run.source_digest(str(tmp_path / "data")) == folder  # nothing changed: the same key
    annotations.write_text('[{"video": "clips/a.mp4", "caption": "a cat and a dog"}]', encoding="utf-8")
    assert local_run.source_digest(str(annotations)) != file
    assert local_run.source_digest(str(tmp_path / "data")) != folder
    before = local_run.source_digest(str(tmp_path / "data"))
    (tmp_path / "data" / "clips" / "b.mp4").write_bytes(b"y")  # a new clip in the folder
    assert local_run.source_digest(str(tmp_path / "data")) != before
    assert local_run.source_digest("") == local_run.source_digest("s3://bucket/data") == ""
