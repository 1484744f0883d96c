"""``cpu_linear: onednn``: fp32 linear layers through oneDNN compute torch's function (forward and every gradient, to
fp32 rounding), only where they should, deterministically, and the training loop runs its forward and backward
under them."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vlp.models.layers import linear
from vlp.models.layers.linear import OneDnnLinear, check_cpu_linear, cpu_linears
from vlp.train.loop import TrainConfig, train
from vlp.train.optim import OptimConfig

pytestmark = pytest.mark.skipif(not linear.onednn_available(), reason="this torch has no oneDNN")


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 96), (2, 33, 96), (33, 2, 96)])
def test_a_linear_under_onednn_is_torchs_to_rounding_forward_and_backward(shape, bias, monkeypatch):
    """Forward and all gradients to fp32 rounding of torch's, each of the three products through oneDNN."""
    products = []
    matmul = linear.onednn_matmul
    monkeypatch.setattr(linear, "onednn_matmul", lambda *a: products.append(a[0].shape) or matmul(*a))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    if shape[0] == 33:
        x = torch.randn(2, 33, 96, generator=g).transpose(0, 1)  # a non-contiguous input, as a permuted activation
    w, b = torch.randn(80, 96, generator=g) / 10, torch.randn(80, generator=g) if bias else None
    leaves = [t.clone().requires_grad_() for t in (x, w, *([b] if bias else []))]
    grad = torch.randn(*x.shape[:-1], 80, generator=g)
    runs = []
    for kind in ("torch", "onednn"):
        inputs = [t.detach().clone().requires_grad_() for t in leaves]
        with cpu_linears(kind):
            out = F.linear(*inputs)
        assert (type(out.grad_fn).__name__ == "OneDnnLinearBackward") == (kind == "onednn")
        out.backward(grad)
        runs.append([out.detach(), *(t.grad for t in inputs)])
    rows = grad.numel() // 80
    # the forward, the input's gradient, the weight's gradient (an (N, M) x (K, M)^T product)
    assert products == [x.shape, grad.shape, (80, rows)], products
    assert all(_close(got, want) for got, want in zip(runs[1], runs[0], strict=True))
    with cpu_linears("onednn"):
        again = F.linear(*[t.detach() for t in leaves])
    assert torch.equal(again, runs[1][0])  # deterministic


def test_only_fp32_cpu_linears_outside_autocast_are_taken():
    x, layer = torch.randn(4, 16), nn.Linear(16, 8)
    with cpu_linears("onednn"):
        assert type(layer(x).grad_fn).__name__ == "OneDnnLinearBackward"  # nn.Linear reaches it through F.linear
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x)
        assert out.dtype == torch.bfloat16 and "OneDnn" not in type(out.grad_fn).__name__
        assert "OneDnn" not in type(layer.double()(x.double()).grad_fn).__name__
        assert torch.equal(x @ x.t(), torch.matmul(x, x.t()))  # other ops pass through
    assert "OneDnn" not in type(nn.Linear(16, 8)(x).grad_fn).__name__  # the mode ends with the context


def test_bad_values_are_refused_in_one_line(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"cpu_linear must be one of \['torch', 'onednn'\], got 'mkl'"):
        check_cpu_linear("mkl")
    with pytest.raises(ValueError, match=r"TrainConfig\.cpu_linear must be one of"):
        TrainConfig(out_dir=str(tmp_path), cpu_linear="mkl")
    monkeypatch.setattr(linear, "onednn_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"this torch has no oneDNN .* set cpu_linear=torch"):
        check_cpu_linear("onednn")
    check_cpu_linear("torch")  # always runs


def test_the_loop_runs_forward_and_backward_through_onednn(tmp_path, monkeypatch):
    """Two updates of a small MLP with and without cpu_linear=onednn: every forward linear goes through OneDnnLinear,
    and the losses and weights agree to rounding; recomputation and compile are refused with it."""
    calls = []
    apply = OneDnnLinear.apply
    monkeypatch.setattr(OneDnnLinear, "apply", lambda *a: calls.append(a[0].shape) or apply(*a))

    def run(kind: str) -> tuple[dict[str, torch.Tensor], list[float]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 1))
        data = [(torch.randn(16, 32), torch.randn(16, 1)) for _ in range(2)]
        out = tmp_path / kind
        cfg = TrainConfig(out_dir=str(out), max_steps=2, log_every=1, progress=False, cpu_linear=kind)
        train(model, lambda m, b: {"loss": F.mse_loss(m(b[0]), b[1])}, data, cfg, OptimConfig(lr=1e-2))
        lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return model.state_dict(), [line["train/loss"] for line in lines if "train/loss" in line]

    want, want_losses = run("torch")
    assert calls == []
    got, losses = run("onednn")
    assert calls == [(16, 32), (16, 64)] * 2  # 2 layers x 2 updates
    assert len(losses) == 2 and losses == pytest.approx(want_losses, rel=1e-5)
    assert all(_close(got[k], want[k]) for k in want)
    for switch in ("compile", "grad_checkpointing"):
        with pytest.raises(ValueError, match="cpu_linear=onednn runs without compile and grad_checkpointing"):
            TrainConfig(out_dir=str(tmp_path), cpu_linear="onednn", **{switch: True})


def test_the_pretrain_step_runs_its_linears_as_its_config_says(tiny_world, tmp_path, monkeypatch):
    """`vlp pretrain`'s step (ALBEF: it needs no prompter; the tiny world) with `pretrain.cpu_linear=onednn` from its
    overrides: its linears go through oneDNN, and its losses are the default run's to rounding."""
    from pathlib import Path

    from vlp.config import load_config
    from vlp.steps.pretrain import pretrain

    calls = []
    apply = OneDnnLinear.apply
    monkeypatch.setattr(OneDnnLinear, "apply", lambda *a: calls.append(1) or apply(*a))
    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
    losses = {}
    for kind in ("torch", "onednn"):
        overrides = ["model.family=albef", "model.albef.queue_size=8", "pretrain.max_steps=2"]
        cfg = load_config(tiny, [*overrides, f"pretrain.cpu_linear={kind}"])
        summary = pretrain(tiny_world["dataset"], tiny_world["frames"], str(tmp_path / kind), cfg)
        losses[kind] = {k: v for k, v in summary["metrics"].items() if k.startswith("train/loss")}
        assert (len(calls) > 0) == (kind == "onednn"), kind
    assert losses["torch"] and losses["onednn"] == pytest.approx(losses["torch"], rel=1e-4)
