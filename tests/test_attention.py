"""vlp.models.layers.attention: torch's kernel in fp32 (the same bits), explicit matmuls for bf16 on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vlp.models.layers.attention import attend
from vlp.models.layers.bert import BertDims, BertLayer, padding_mask
from vlp.models.layers.blocks import Attention


def qkv(batch: int = 3, heads: int = 4, queries: int = 7, keys: int = 7, dim: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, queries, dim, generator=g)
    k, v = (torch.randn(batch, heads, keys, dim, generator=g) for _ in range(2))
    return q, k, v


def key_mask(batch: int = 3, keys: int = 7) -> torch.Tensor:
    mask = torch.ones(batch, 1, 1, keys, dtype=torch.bool)
    mask[0, ..., 4:] = False  # the first row's last keys are padding
    mask[2, ..., 6:] = False
    return mask


CASES = {
    "plain": {},
    "boolean mask": {"mask": key_mask()},
    "additive mask": {"mask": torch.where(key_mask(), 0.0, -1e4)},
    "causal": {"is_causal": True},
    "scale": {"scale": 0.3},
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_is_torch_kernel_bit_for_bit(case: str) -> None:
    """In fp32 ``attend`` is ``F.scaled_dot_product_attention`` itself: every recorded fp32 figure keeps its bits."""
    q, k, v = qkv()
    kwargs = CASES[case]
    sdpa_kwargs = {"attn_mask" if key == "mask" else key: value for key, value in kwargs.items()}
    assert torch.equal(attend(q, k, v, **kwargs), F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs))


def test_fp32_dropout_draws_as_the_kernel() -> None:
    q, k, v = qkv()
    torch.manual_seed(5)
    got = attend(q, k, v, key_mask(), dropout_p=0.1)
    torch.manual_seed(5)
    assert torch.equal(got, F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask(), dropout_p=0.1))


@pytest.mark.parametrize("case", list(CASES))
def test_explicit_matches_kernel_in_fp32(case: str) -> None:
    """The explicit path computes the same function: forward and input gradients to fp32 rounding."""
    kwargs = CASES[case]
    sdpa_kwargs = {"attn_mask" if key == "mask" else key: value for key, value in kwargs.items()}
    ours, theirs = (tuple(t.clone().requires_grad_() for t in qkv(keys=7)) for _ in range(2))
    out = attend(*ours, **kwargs, explicit=True)
    ref = F.scaled_dot_product_attention(*theirs, **sdpa_kwargs)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5)


def test_cross_attention_shapes() -> None:
    """Queries and keys of different lengths (BERT's cross-attention), with a key mask."""
    q, _, _ = qkv(queries=5)
    _, k, v = qkv(keys=7, seed=1)
    torch.testing.assert_close(
        attend(q, k, v, key_mask(), explicit=True), F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask())
    )


def test_bf16_on_cpu_takes_the_explicit_path() -> None:
    """bf16 queries on the CPU: the explicit path's bits, within bf16 rounding of fp32's attention."""
    q, k, v = qkv()
    mask = key_mask()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attend(*(t.bfloat16() for t in (q, k, v)), mask)
        explicit = attend(*(t.bfloat16() for t in (q, k, v)), mask, explicit=True)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, explicit)
    exact = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (got.float() - exact).abs().max() < 0.03
    assert not torch.equal(got, F.scaled_dot_product_attention(*(t.bfloat16() for t in (q, k, v)), attn_mask=mask))


def test_bf16_gradients_close_to_fp32() -> None:
    ours = tuple(t.bfloat16().requires_grad_() for t in qkv())
    exact = tuple(t.clone().requires_grad_() for t in qkv())
    grad = torch.randn(3, 4, 7, 16, generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attend(*ours, key_mask())
    out.backward(grad.bfloat16())
    F.scaled_dot_product_attention(*exact, attn_mask=key_mask()).backward(grad)
    for a, b in zip(ours, exact, strict=True):
        assert a.grad is not None and b.grad is not None
        assert (a.grad.float() - b.grad).abs().max() < 0.05 * b.grad.abs().max()


def test_explicit_dropout_keeps_the_expected_mass() -> None:
    """Dropout drops probabilities and scales the rest by 1 / (1 - p), as the kernel's does: with uniform
    probabilities over ones the output's mean stays 1 (unscaled drops would give 1 - p) and its entries differ."""
    q, k = torch.zeros(4, 8, 64, 16), torch.zeros(4, 8, 64, 16)
    v = torch.ones(4, 8, 64, 16)
    torch.manual_seed(0)
    out = attend(q, k, v, dropout_p=0.2, explicit=True)
    assert abs(out.mean().item() - 1.0) < 0.02
    assert out.std().item() > 0.05  # the draws differ from entry to entry
    torch.manual_seed(0)
    assert torch.equal(out, attend(q, k, v, dropout_p=0.2, explicit=True))  # the global generator: same seed, same bits


def test_layers_use_it_in_bf16() -> None:
    """A ViT attention and a BERT layer under CPU bf16 autocast run the explicit path (not torch's kernel) and stay
    within bf16 rounding of their fp32 outputs."""
    torch.manual_seed(0)
    attn = Attention(32, num_heads=4).eval()
    x = torch.randn(2, 9, 32)
    layer = BertLayer(BertDims(width=32, heads=4, intermediate=64, dropout=0.0)).eval()
    mask = padding_mask(torch.tensor([[1] * 9, [1] * 5 + [0] * 4]), 9, "sdpa", torch.float32)
    calls = []
    real = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].dtype)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "scaled_dot_product_attention", counting)
        fp32 = attn(x), layer(x, mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = attn(x), layer(x, mask)
    assert calls == [torch.float32, torch.float32]  # fp32 through torch's kernel; bf16 never reached it
    for low, exact in zip(bf16, fp32, strict=True):
        assert (low.float() - exact).abs().max() < 0.05 * exact.abs().max()
