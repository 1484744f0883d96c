"""Training never saves or resumes from NaN or infinite values, and never reads or writes through a symbolic link in
its output: the loop applies the rule its readers apply (issue 58)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from test_train_loop import OPT, Killed, TinyMLP, ce_step, cfg_for, killing, make_data, make_loader
from vlp import storage
from vlp.losses.matching import hard_negative_weights, sample_hard_negatives
from vlp.train.checkpoint import (
    MODEL_FILE,
    OPTIM_FILE,
    DamagedCheckpointError,
    NonFiniteCheckpointError,
    all_finite,
    list_checkpoints,
    load_checkpoint,
    nonfinite_names,
    save_checkpoint,
)
from vlp.train.loop import NonFiniteTrainingError, train
from vlp.train.optim import OptimConfig, build_optimizer

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
ALBEF = ["model.family=albef", "model.albef.queue_size=8", "model.albef.momentum=0.9"]


def steps_in(out: Path) -> list[int]:
    return [step for step, _ in list_checkpoints(str(out / "checkpoints"))]


def poison(file: Path, name: str | None = None) -> str:
    """Put a NaN into one floating tensor of the safetensors ``file`` (``name``, else the first); returns its name."""
    tensors = load_file(file)
    with safe_open(file, "pt") as opened:
        metadata = opened.metadata()  # the optimiser file's structure
    name = name or next(k for k, t in tensors.items() if t.is_floating_point())
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, file, metadata=metadata)
    return name


# --------------------------------------------------------------------------- the checks


def test_all_finite_sees_a_nan_or_an_infinity_in_any_tensor_and_names_them():
    tensors = {"a": torch.randn(5, 3), "b": torch.randn(7), "steps": torch.tensor(3), "h": torch.ones(4).half()}
    assert bool(all_finite(tensors.values())) and nonfinite_names(tensors) == []
    for name, value in (("b", float("nan")), ("a", float("inf")), ("h", float("-inf"))):
        bad = dict(tensors, **{name: tensors[name].clone()})
        bad[name].view(-1)[1] = value
        assert not bool(all_finite(bad.values())), name
        assert nonfinite_names(bad) == [name]
    big = [torch.full((4,), 3e38)]  # finite, but its sum overflows: a False that the exact check clears
    assert nonfinite_names({"big": big[0]}) == []


def test_hard_negatives_are_drawn_from_nan_similarities_without_failing():
    sim = torch.randn(4, 4)
    finite = hard_negative_weights(sim)
    sim[2] = float("nan")  # a diverged model's row
    sim[3, 0] = float("inf")
    weights = hard_negative_weights(sim)
    assert torch.equal(weights[:2], finite[:2]), "finite rows keep their softmax"
    assert torch.equal(weights[2], torch.tensor([1 / 3, 1 / 3, 0, 1 / 3])) and weights[3, 3] == 0
    neg_t, neg_v = sample_hard_negatives(sim, sim.t().contiguous(), torch.Generator().manual_seed(0))
    assert all(int(i) != row for row, i in enumerate(neg_t)) and all(int(i) != row for row, i in enumerate(neg_v))


@pytest.mark.parametrize("lr", [float("inf"), float("nan"), 1e300, 3.5e37])
def test_a_learning_rate_past_float32_is_refused_before_an_update(lr: float):
    with pytest.raises(ValueError, match=r"^OptimConfig.lr=\S+ is too large: AdamW's first update scales a step by "):
        OptimConfig(lr=lr)
    OptimConfig(lr=1e30)  # absurd, but the update fits: the loop's checks stop what it does to the weights


# --------------------------------------------------------------------------- the loop stops before a checkpoint


def test_a_loss_that_turns_infinite_at_step_3_stops_before_its_checkpoint(tmp_path: Path):
    calls = {"n": 0}

    def overflowing(model: torch.nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        out = ce_step(model, batch)
        calls["n"] += 1
        if calls["n"] > 4:  # from update 3's first micro-batch on (2 per update)
            loss = out["loss"] * float("inf")
            out = {"loss": loss, "loss_ce": loss.detach(), "temp": out["temp"]}
        return out

    x, y = make_data(10)
    with pytest.raises(NonFiniteTrainingError) as caught:
        train(TinyMLP(), overflowing, make_loader(x, y, 3), cfg_for(tmp_path, ckpt_every=1, keep_last=9), OPT)
    said = str(caught.value)
    assert re.fullmatch(
        r"train diverged at step 3 \(lr [^)]+\): the loss terms loss=inf, loss_ce=inf; no checkpoint holds this "
        r"step; a rerun resumes from step 2 with the weights and learning rate saved there: lower the learning rate "
        r"or check the inputs, and train into a new --out \(or delete its checkpoints\)",
        said,
    ), said
    assert calls["n"] == 6, "nothing ran after the update whose loss was infinite"
    assert steps_in(tmp_path) == [1, 2]


def test_weights_an_update_makes_nan_stop_training_before_its_checkpoint(tmp_path: Path):
    model = TinyMLP()
    updates = {"n": 0}

    def step(m: torch.nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        updates["n"] += 1
        if updates["n"] == 2:  # update 1's second micro-batch: its gradient of fc2.weight is NaN, its loss finite
            m.fc2.weight.register_hook(lambda grad: grad * float("nan"))
        return ce_step(m, batch)

    x, y = make_data(10)
    unclipped = OptimConfig(lr=1e-2, warmup_steps=2, grad_clip=0.0)
    with pytest.raises(NonFiniteTrainingError) as caught:
        train(model, step, make_loader(x, y, 3), cfg_for(tmp_path, ckpt_every=1), unclipped)
    said = str(caught.value)
    assert re.fullmatch(
        r"train diverged at step 1 \(lr 0\.005\): NaN or infinite weights in 1 of 7 parameters \(fc2\.weight\); no "
        r"checkpoint holds this step; lower the learning rate or check the inputs",
        said,
    ), said
    assert updates["n"] == 2 and not (tmp_path / "checkpoints").exists()


def test_nan_starting_weights_are_refused_before_the_first_update(tmp_path: Path):
    model = TinyMLP()
    with torch.no_grad():
        model.norm.bias[3] = float("inf")
    x, y = make_data(10)
    with pytest.raises(NonFiniteTrainingError, match=r"^train cannot start from step 0: NaN or infinite weights in 1 "
                       r"of 7 parameters \(norm\.bias\) \(the model was built or loaded with them\)$"):  # fmt: skip
        train(model, ce_step, make_loader(x, y, 3), cfg_for(tmp_path), OPT)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "metrics.jsonl").exists()


# --------------------------------------------------------------------------- a resume skips a NaN checkpoint


@pytest.mark.parametrize("file", [MODEL_FILE, OPTIM_FILE])
def test_a_checkpoint_holding_a_nan_is_not_resumed_from(tmp_path: Path, file: str):
    x, y = make_data(10)
    straight = TinyMLP()
    train(straight, ce_step, make_loader(x, y, 3), cfg_for(tmp_path / "straight"), OPT)
    out = tmp_path / "run"
    with pytest.raises(Killed):  # checkpoints at 3 and 6, killed during update 7
        train(TinyMLP(), killing(ce_step, 12), make_loader(x, y, 3), cfg_for(out), OPT)
    bad = out / "checkpoints" / "step-000006" / file
    name = poison(bad)
    probe = TinyMLP(seed=5)
    before = [p.detach().clone() for p in probe.parameters()]
    with pytest.raises(
        NonFiniteCheckpointError, match=rf"^{re.escape(str(bad))} holds NaN or infinite values in 1 of "
    ):
        load_checkpoint(str(bad.parent), probe, build_optimizer(probe, OPT), restore_rng=False)
    assert all(torch.equal(p, q) for p, q in zip(probe.parameters(), before, strict=True)), "nothing restored"
    resumed = TinyMLP(seed=5)
    skipped = rf"damaged checkpoint: {re.escape(str(bad))} holds NaN or infinite values in 1 of \d+ tensors "
    with pytest.warns(UserWarning, match=rf"{skipped}\({re.escape(name)}\): .*; resumed from .*step-000003$"):
        result = train(resumed, ce_step, make_loader(x, y, 3), cfg_for(out), OPT)
    assert result.start_step == 3 and result.step == 8 and steps_in(out) == [6, 8]
    for (key, p), q in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(p, q), key
    assert bool(all_finite(load_file(out / "checkpoints" / "step-000006" / file).values())), "step 6 written anew"


def test_every_checkpoint_holding_a_nan_is_one_error_naming_them(tmp_path: Path):
    model = TinyMLP()
    for step in (1, 2):
        save_checkpoint(str(tmp_path / "checkpoints"), step, model, None, None)
        poison(tmp_path / "checkpoints" / f"step-{step:06d}" / MODEL_FILE, "head.weight")
    every = r"^every checkpoint under .* is damaged \(.*step-000002/model.safetensors holds NaN .*\(head.weight\).*"
    with pytest.raises(DamagedCheckpointError, match=every + r"step-000001/model.safetensors holds NaN"):
        train(TinyMLP(), ce_step, make_loader(*make_data(10), 3), cfg_for(tmp_path), OPT)


# --------------------------------------------------------------------------- the loop's own link checks


def test_the_loop_refuses_a_link_in_its_output_before_reading_or_writing(tmp_path: Path):
    x, y = make_data(10)
    out = tmp_path / "run"
    train(TinyMLP(), ce_step, make_loader(x, y, 3), cfg_for(out, max_steps=3), OPT)
    outside = tmp_path / "outside"
    shutil.move(out / "checkpoints" / "step-000003", outside)
    (out / "checkpoints" / "step-000003").symlink_to(outside)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    with pytest.raises(storage.LinkError, match=r"^the training output .* holds a symbolic link, "
                       r"checkpoints/step-000003 -> .*outside: vlp never writes one there"):  # fmt: skip
        train(TinyMLP(), ce_step, make_loader(x, y, 3), cfg_for(out), OPT)
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before


def test_a_link_put_in_while_training_is_refused_before_the_next_checkpoint(tmp_path: Path):
    out, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    calls = {"n": 0}

    def linking(model: torch.nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        calls["n"] += 1
        if calls["n"] == 7:  # update 4, after the checkpoint of update 3: the next one goes to step 6
            (out / "checkpoints" / "step-000006").symlink_to(outside)
        return ce_step(model, batch)

    x, y = make_data(10)
    with pytest.raises(storage.LinkError, match=r"checkpoints/step-000006 -> "):
        train(TinyMLP(), linking, make_loader(x, y, 3), cfg_for(out), OPT)
    assert list(outside.iterdir()) == [] and steps_in(out) == [3]


# --------------------------------------------------------------------------- through `vlp pretrain`


def vlp_pretrain(world: dict[str, str], out: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "vlp.cli", "pretrain", "--dataset", world["dataset"], "--frames", world["frames"],
           "--out", str(out), "--config", str(TINY), *ALBEF, "pretrain.ckpt_every=1", *overrides]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def refusal(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused command (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if " INFO " not in line]
    assert len(lines) == 1 and lines[0].startswith("vlp pretrain: error: "), lines
    return lines[0]


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def albef_run(tiny_world: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`vlp pretrain` of ALBEF, 2 updates, a checkpoint after each."""
    out = tmp_path_factory.mktemp("albef") / "out"
    proc = vlp_pretrain(tiny_world, out, "pretrain.max_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("linked", ["checkpoints/step-000002", "checkpoints"])
def test_vlp_pretrain_refuses_a_linked_checkpoint_and_writes_nothing_outside(
    tiny_world: dict[str, str], albef_run: Path, tmp_path: Path, linked: str
):
    out, outside = tmp_path / "out", tmp_path / "outside"
    shutil.copytree(albef_run, out)
    shutil.move(out / linked, outside)
    (out / linked).symlink_to(outside, target_is_directory=True)
    before, inside = files(outside), files(out)
    said = refusal(vlp_pretrain(tiny_world, out, "pretrain.max_steps=2"))
    assert f"symbolic link, {linked} -> {outside}" in said, said
    assert files(outside) == before, "nothing written through the link"
    assert files(out) == inside, "nothing written in the output either"


@pytest.mark.slow
def test_vlp_pretrain_resumes_past_a_nan_checkpoint_to_the_one_before(
    tiny_world: dict[str, str], albef_run: Path, tmp_path: Path
):
    out = tmp_path / "out"
    shutil.copytree(albef_run, out)
    poison(out / "checkpoints" / "step-000002" / MODEL_FILE)
    proc = vlp_pretrain(tiny_world, out, "pretrain.max_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"skipped the damaged checkpoint: .*step-000002/model.safetensors holds NaN or infinite values",
                     proc.stderr), proc.stderr[-3000:]  # fmt: skip
    assert "resuming from step 1" in proc.stderr
    weights = load_file(out / "checkpoints" / "step-000002" / MODEL_FILE)
    assert (
        bool(all_finite(weights.values()))
        and weights.keys() == load_file(albef_run / "checkpoints" / "step-000002" / MODEL_FILE).keys()
    )


@pytest.mark.slow
def test_vlp_pretrain_with_a_learning_rate_that_overflows_stops_with_one_line(
    tiny_world: dict[str, str], tmp_path: Path
):
    out = tmp_path / "out"
    said = refusal(vlp_pretrain(tiny_world, out, "pretrain.max_steps=3", "pretrain.lr=1.0e+30"))
    assert re.fullmatch(r"vlp pretrain: error: pretrain diverged at step 2 \(lr [^)]+\): the loss terms \S+=nan.*; "
                        r"no checkpoint holds this step; a rerun resumes from step 1 with .*", said), said  # fmt: skip
    assert steps_in(out) == [1]
