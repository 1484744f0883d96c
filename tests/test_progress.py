"""What a training step says while it trains: a bar on a terminal, one plain line per logged interval elsewhere,
nothing with ``progress: false``; and never a different run for it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_train_loop import OPT, TinyMLP, ce_step, make_data, make_loader
from vlp.train import loop
from vlp.train.loop import TrainConfig, format_duration, progress_line, train

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
LINE = re.compile(
    r"^(?P<name>\S+) step (?P<step>\d+)/(?P<total>\d+) \((?P<pct>\d+)%\) loss (?P<loss>\d+\.\d{4}) "
    r"lr (?P<lr>\d\.\de[+-]\d\d) (?P<spi>[\d.e+-]+) s/it eta (?P<eta>(\d+h\d\dm|\d+m\d\ds|\d+s))$"
)
TIMING = ("train/clips_per_s", "train/peak_rss_mb")


def test_progress_line_and_durations_read_as_documented():
    metrics = {"train/loss": 2.31, "train/lr": 1e-4, "train/grad_norm": 3.0}
    assert progress_line("pretrain", 40, 200, metrics, 3.2) == (
        "pretrain step 40/200 (20%) loss 2.3100 lr 1.0e-04 3.2 s/it eta 8m32s"
    )
    assert LINE.match(progress_line("pretrain", 40, 200, metrics, 3.2))
    assert [format_duration(s) for s in (0, 9.4, 59.6, 512, 3600, 7384)] == ["0s", "9s", "1m00s", "8m32s", "1h00m",
                                                                             "2h03m"]  # fmt: skip


def _run(out: Path, progress: bool, max_steps: int = 7, log_every: int = 3) -> torch.nn.Module:
    x, y = make_data(10)
    model = TinyMLP()
    cfg = TrainConfig(out_dir=str(out), max_steps=max_steps, grad_accum=2, log_every=log_every, ckpt_every=3,
                      seed=3, progress=progress, name="pretrain")  # fmt: skip
    train(model, ce_step, make_loader(x, y, 3), cfg, OPT)
    return model


def _steps(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows if "step" in row]


def test_off_a_terminal_each_logged_interval_is_one_line_and_the_run_is_the_same(tmp_path, capsys):
    quiet = _run(tmp_path / "quiet", progress=False)
    assert capsys.readouterr().err == "", "progress: false says nothing"
    talking = _run(tmp_path / "talking", progress=True)  # capsys's stderr is no terminal
    err = capsys.readouterr().err.splitlines()
    matches = [LINE.match(line) for line in err]
    assert all(matches) and len(err) == 3, err  # steps 3, 6 and the last, 7
    assert [(m["name"], int(m["step"]), int(m["total"]), int(m["pct"])) for m in matches] == [
        ("pretrain", 3, 7, 42), ("pretrain", 6, 7, 85), ("pretrain", 7, 7, 100)
    ]  # fmt: skip
    logged = _steps(tmp_path / "talking")
    assert [float(m["loss"]) for m in matches] == [pytest.approx(r["train/loss"], abs=5e-5) for r in logged]
    assert [m["lr"] for m in matches] == [f"{r['train/lr']:.1e}" for r in logged]
    assert matches[-1]["eta"] == "0s"
    assert logged == _steps(tmp_path / "quiet"), "printing changes no metric"
    for p, q in zip(quiet.parameters(), talking.parameters(), strict=True):
        assert torch.equal(p, q), "printing changes no weight"

    _run(tmp_path / "talking", progress=True, max_steps=10)  # a resume says so before training
    err = capsys.readouterr().err.splitlines()
    checkpoint = tmp_path / "talking" / "checkpoints" / "step-000007"
    assert err[0] == f"pretrain: resuming from step 7 ({checkpoint}); training to step 10"
    assert [int(LINE.match(line)["step"]) for line in err[1:]] == [9, 10]


def test_on_a_terminal_a_bar_and_no_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loop, "_stderr_is_tty", lambda: True)
    _run(tmp_path / "bar", progress=True)
    err = capsys.readouterr().err
    assert "pretrain:" in err and "7/7" in err and "loss=" in err, err  # tqdm's bar: desc, count and postfix
    assert not any(LINE.match(line) for line in re.split(r"[\r\n]", err))
    _run(tmp_path / "off", progress=False)
    assert capsys.readouterr().err == ""


def test_a_training_cli_step_off_a_terminal_prints_a_line_per_logged_interval(tiny_world, tmp_path):
    cmd = [sys.executable, "-m", "vlp.cli", "pretrain-prompter", "--dataset", tiny_world["dataset"],
           "--frames", tiny_world["frames"], "--out", str(tmp_path / "out"), "--config", str(TINY),
           "pretrain.max_steps=6", "pretrain.log_every=2", "pretrain.progress=true"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [m for m in map(LINE.match, done.stderr.splitlines()) if m]
    assert [(int(m["step"]), int(m["total"])) for m in lines] == [(2, 6), (4, 6), (6, 6)], done.stderr[-3000:]
    assert "\r" not in done.stderr, "no bar off a terminal"
