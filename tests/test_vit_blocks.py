"""vlp's ViT parts (``vlp.models.layers.blocks``) against timm's, which they replace in ALPRO's TimeSformer and
ALBEF's ViT: the same parameters from the same seed, the same bits forward and backward (stochastic depth
included), and building either encoder imports neither timm nor ``torch._dynamo``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from timm.layers import Attention, DropPath, LayerNorm, Mlp, PatchEmbed, trunc_normal_
from timm.models.vision_transformer import Block

from vlp.models.layers import blocks

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module


def built(make_theirs, make_mine):
    torch.manual_seed(3)
    theirs = make_theirs()
    torch.manual_seed(3)
    return theirs, make_mine()


def assert_same(theirs, mine, x: torch.Tensor, train: bool) -> None:
    a, b = theirs.state_dict(), mine.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    got = []
    for module in (theirs, mine):
        module.train(train)
        xs = x.detach().clone().requires_grad_(True)
        torch.manual_seed(5)
        out = module(xs)
        out.pow(2).sum().backward()
        got.append((out.detach(), {n: p.grad for n, p in module.named_parameters()}, xs.grad))
    (out_a, grads_a, in_a), (out_b, grads_b, in_b) = got
    assert torch.equal(out_a, out_b) and torch.equal(in_a, in_b)
    assert list(grads_a) == list(grads_b) and all(torch.equal(grads_a[k], grads_b[k]) for k in grads_a)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_block_equals_timms_vit_block(train):
    theirs, mine = built(lambda: Block(48, 4, mlp_ratio=4.0, qkv_bias=True, drop_path=0.3, norm_layer=LayerNorm),
                         lambda: blocks.Block(48, 4, mlp_ratio=4.0, drop_path=0.3))  # fmt: skip
    assert_same(theirs, mine, torch.randn(6, 11, 48), train)
    if train:  # stochastic depth dropped some samples' branches: not the eval output
        torch.manual_seed(5)
        dropped = mine(torch.randn(6, 11, 48))
        mine.eval()
        torch.manual_seed(5)
        assert not torch.equal(dropped, mine(torch.randn(6, 11, 48)))


def test_attention_mlp_drop_path_and_patches_equal_timms():
    x = torch.randn(5, 7, 32)
    theirs, mine = built(lambda: Attention(32, num_heads=4, qkv_bias=True), lambda: blocks.Attention(32, 4))
    assert_same(theirs, mine, x, train=True)
    theirs, mine = built(lambda: Mlp(32, hidden_features=80, act_layer=torch.nn.GELU), lambda: blocks.Mlp(32, 80))
    assert_same(theirs, mine, x, train=True)
    theirs, mine = built(lambda: DropPath(0.4), lambda: blocks.DropPath(0.4))
    assert_same(theirs, mine, x, train=True)
    theirs, mine = built(lambda: PatchEmbed(32, 8, 3, 24, strict_img_size=False), lambda: blocks.PatchEmbed(8, 3, 24))
    assert_same(theirs, mine, torch.randn(2, 3, 16, 40), train=True)  # not the configured size: any multiple of 8
    with pytest.raises(ValueError, match="not a multiple of the patch size 8"):
        mine(torch.randn(1, 3, 16, 20))
    torch.manual_seed(9)
    a = trunc_normal_(torch.empty(300), std=0.02)
    torch.manual_seed(9)
    b = blocks.trunc_normal_(torch.empty(300), std=0.02)
    assert torch.equal(a, b) and a.abs().max() <= 2.0 and 0.01 < float(a.std()) < 0.03


def test_the_layer_norm_is_timms():
    theirs, mine = LayerNorm(32), blocks.layer_norm(32)
    x = torch.randn(4, 32) * 3 + 1
    assert mine.eps == theirs.eps == 1e-6 and torch.equal(mine(x), theirs(x))


def test_building_the_video_encoders_imports_neither_timm_nor_dynamo():
    code = ("import sys; from vlp.models.layers.timesformer import TimeSformer, TimeSformerConfig; "
            "from vlp.models.layers.vit import FrameViT, FrameViTConfig; TimeSformer(TimeSformerConfig.tiny()); "
            "FrameViT(FrameViTConfig(img_size=32, patch_size=8, width=32, depth=2, heads=2, num_frames=2)); "
            "print([m for m in ('timm', 'torch._dynamo') if m in sys.modules])")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
