"""``cpu_dropout: 16bit``: dropout masks from 16-bit draws keep each element at the resolved rate, scale it so that its
expectation is kept, multiply the gradient by the same mask, reach every dropout of vlp's BERT layers (the attention
probabilities' included, in fp32 too), draw the forward's masks again in a checkpointed recomputation and in compiled
code, and leave everything else to ``F.dropout``; the training loop sets them from its config."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vlp.models.layers import dropout as dropout_module
from vlp.models.layers.bert import BertDims, BertLayer
from vlp.models.layers.dropout import LEVELS, Dropout, check_cpu_dropout, dropout, keep_mask, set_cpu_dropout
from vlp.train.loop import TrainConfig, train
from vlp.train.optim import OptimConfig


def _within(count: float, n: int, q: float, sigmas: float = 6.0) -> bool:
    """Whether ``count`` successes of ``n`` draws are within ``sigmas`` standard deviations of rate ``q``."""
    return abs(count - n * q) <= sigmas * math.sqrt(n * q * (1 - q))


@pytest.mark.parametrize("drop", [6554, LEVELS // 2, 58982])
def test_keep_mask_keeps_each_element_independently_at_the_resolved_rate(drop):
    n, q = 1 << 20, 1 - drop / LEVELS
    mask = keep_mask((n // 8, 8), drop, torch.Generator().manual_seed(0))
    assert mask.dtype == torch.bool and mask.shape == (n // 8, 8)
    assert _within(int(mask.sum()), n, q), (int(mask.sum()), n * q)
    lanes = mask.reshape(-1, 4)  # the four 16-bit lanes of each 64-bit draw: each at the rate, pairs independent
    for lane in range(4):
        assert _within(int(lanes[:, lane].sum()), n // 4, q), lane
        other = (lane + 1) % 4
        assert _within(int((lanes[:, lane] & lanes[:, other]).sum()), n // 4, q * q), (lane, other)
    assert _within(int((mask[1:] & mask[:-1]).sum()), mask[1:].numel(), q * q)  # consecutive draws independent
    again = keep_mask((n // 8, 8), drop, torch.Generator().manual_seed(0))
    assert torch.equal(again, mask)  # the same seed, the same mask
    assert not torch.equal(keep_mask((n // 8, 8), drop, torch.Generator().manual_seed(1)), mask)
    assert bool(keep_mask((5, 3), 0).all()) and not bool(keep_mask((5, 3), LEVELS).any())
    assert keep_mask((7,), drop).shape == (7,)  # a size that is not a multiple of four
    with pytest.raises(ValueError, match=r"drop must be in \[0, 65536\], got 65537"):
        keep_mask((4,), LEVELS + 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_16bit_dropout_scales_what_it_keeps_and_its_gradient_by_the_same_mask(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g).to(dtype).requires_grad_()
    grad = torch.randn(64, 96, generator=g).to(dtype)
    torch.manual_seed(3)
    out = dropout(x, 0.1, True, "16bit")
    torch.manual_seed(3)  # the mask it drew, drawn again from the global generator
    keep = keep_mask(x.shape, 6554)
    scale = LEVELS / (LEVELS - 6554)  # 0.1 resolved to 6,554 / 65,536
    assert out.dtype == dtype and type(out.grad_fn).__name__ == "_Dropout16Backward"
    assert torch.equal(out, x.detach().mul(keep).mul_(scale))
    assert not bool(out[~keep].any()) and 0 < int((~keep).sum()) < x.numel() // 5
    out.backward(grad)
    assert torch.equal(x.grad, grad.mul(keep).mul_(scale))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast leaves dropout in its input's dtype
        assert dropout(x.detach(), 0.1, True, "16bit").dtype == dtype


def test_the_expectation_is_the_inputs():
    """Kept values are scaled by the inverse of the share kept: the mean of many dropped ones is one."""
    torch.manual_seed(0)
    n = 1 << 22
    for p in (0.1, 0.45):
        out = dropout(torch.ones(n), p, True, "16bit")
        kept = round((1 - round(p * LEVELS) / LEVELS) * n)
        sd = math.sqrt(n * p * (1 - p)) / kept  # of the mean, through the count kept
        assert abs(float(out.double().mean()) - 1) < 6 * sd, (p, float(out.mean()))


def test_everything_else_is_f_dropouts():
    x = torch.randn(32, 48)
    for kind in ("torch", "16bit"):
        torch.manual_seed(5)
        want = F.dropout(x, 0.3)
        torch.manual_seed(5)
        got = dropout(x, 0.3, True, kind)
        assert torch.equal(got, want) == (kind == "torch"), kind  # 16bit: other masks
        assert torch.equal(dropout(x, 0.3, False, kind), x)  # evaluation
        assert torch.equal(dropout(x, 0.0, True, kind), x)
        assert not bool(dropout(x, 1.0, True, kind).any())
        torch.manual_seed(5)
        tiny = dropout(x, 1e-6, True, kind)  # rounds to no 16-bit value: torch's, with its masks
        torch.manual_seed(5)
        assert torch.equal(tiny, F.dropout(x, 1e-6))
        with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
            dropout(x, 1.5, True, kind)
    torch.manual_seed(5)
    inplace = x.clone()
    assert dropout(inplace, 0.3, True, "16bit", inplace=True) is inplace  # in place: torch's
    assert torch.equal(inplace, want)
    ints = torch.arange(6)
    with pytest.raises(RuntimeError):  # not a float tensor: torch's says so
        dropout(ints, 0.5, True, "16bit")
    with pytest.raises(ValueError, match=r"cpu_dropout must be one of \['torch', '16bit'\], got 'fast'"):
        check_cpu_dropout("fast")
    with pytest.raises(ValueError, match=r"cpu_dropout must be one of"):
        dropout(x, 0.3, True, "fast")


def _calls(monkeypatch) -> list[tuple[int, ...]]:
    calls: list[tuple[int, ...]] = []
    apply = dropout_module._Dropout16.apply
    record = lambda x, drop: calls.append(tuple(x.shape)) or apply(x, drop)  # noqa: E731
    monkeypatch.setattr(dropout_module._Dropout16, "apply", record)
    return calls


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_every_dropout_of_a_bert_layer_takes_the_setting(attn, monkeypatch):
    """The attention probabilities', the attention output's and the feed-forward output's, in fp32 (sdpa's path
    computes in explicit ops then) and bf16; none in evaluation, none with ``torch``."""
    calls = _calls(monkeypatch)
    torch.manual_seed(0)
    layer = BertLayer(BertDims(width=32, heads=4, intermediate=64, attn=attn))
    x = torch.randn(2, 5, 32)
    assert set_cpu_dropout(layer, "torch") == 3
    layer(x, None).sum().backward()
    assert calls == []
    assert set_cpu_dropout(layer, "16bit") == 3
    for dtype in (torch.float32, torch.bfloat16):
        calls.clear()
        layer.to(dtype)(x.to(dtype), None).sum().backward()
        assert sorted(calls) == [(2, 4, 5, 5), (2, 5, 32), (2, 5, 32)], (dtype, calls)
    layer.float().eval()
    calls.clear()
    assert torch.equal(layer(x, None), layer(x, None)) and calls == []


def test_a_checkpointed_or_compiled_layer_draws_the_forwards_masks():
    """The recomputation in the backward restores the generator and draws the forward's masks, so the gradients are
    the plain layer's bit for bit; a compiled layer draws the eager one's (its outputs differ by rounding alone)."""
    torch.manual_seed(0)
    layer = BertLayer(BertDims(width=32, heads=4, intermediate=64))
    set_cpu_dropout(layer, "16bit")
    x = torch.randn(2, 5, 32)

    def run(forward) -> tuple[torch.Tensor, list[torch.Tensor]]:
        layer.zero_grad()
        torch.manual_seed(7)
        out = forward(x, None)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in layer.parameters()]

    out, grads = run(layer)
    again, again_grads = run(lambda *a: checkpoint(layer, *a, use_reentrant=False))
    assert torch.equal(again, out)
    assert all(torch.equal(a, b) for a, b in zip(again_grads, grads, strict=True))
    # compiled: the same masks, fused element-wise ops (to rounding; other masks move the output by ~1)
    again, again_grads = run(torch.compile(layer))
    assert torch.allclose(again, out, rtol=0, atol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-4) for a, b in zip(again_grads, grads, strict=True))


def test_the_loop_sets_the_masks_from_its_config(tmp_path, monkeypatch):
    """Two updates of a small model with dropout: ``cpu_dropout=16bit`` draws every mask from 16-bit draws, gives the
    same weights in two runs, other weights than ``torch``'s; bad values are refused in one line."""
    calls = _calls(monkeypatch)

    def run(kind: str, name: str) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), Dropout(0.2), nn.Linear(64, 1))
        data = [(torch.randn(16, 32), torch.randn(16, 1)) for _ in range(2)]
        out = tmp_path / name
        cfg = TrainConfig(out_dir=str(out), max_steps=2, log_every=1, progress=False, cpu_dropout=kind)
        train(model, lambda m, b: {"loss": F.mse_loss(m(b[0]), b[1])}, data, cfg, OptimConfig(lr=1e-2))
        assert len((out / "metrics.jsonl").read_text().splitlines()) >= 2
        assert model[2].kind == kind
        return model.state_dict()

    want = run("torch", "torch")
    assert calls == []
    first, second = run("16bit", "a"), run("16bit", "b")
    assert calls == [(16, 64)] * 4  # 2 updates x 2 runs
    assert all(torch.equal(first[k], second[k]) for k in first)  # the same seed, the same bytes
    assert not all(torch.equal(first[k], want[k]) for k in want)  # other masks than torch's
    with pytest.raises(ValueError, match=r"TrainConfig\.cpu_dropout must be one of \['torch', '16bit'\]"):
        TrainConfig(out_dir=str(tmp_path), cpu_dropout="fast")


def test_the_config_loader_refuses_a_value_that_is_not_one():
    from vlp.config import load_config

    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
    assert load_config(tiny, ["pretrain.cpu_dropout=16bit"]).pretrain.cpu_dropout == "16bit"
    with pytest.raises(ValueError, match="cpu_dropout"):
        load_config(tiny, ["pretrain.cpu_dropout=fast"])
    assert load_config(tiny, []).pretrain.cpu_dropout == "torch"  # the default keeps torch's masks
