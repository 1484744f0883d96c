"""vlp's CLIP (``vlp.models.layers.clip``) against transformers' ``CLIPModel``, which it replaces in TS2-Net: the
same weights from the same seed, the same bits forward and backward through both towers (padded text and not), the
same block as TS2-Net's aggregator uses; and building TS2-Net imports none of transformers' model code."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import CLIPModel
from transformers.models.clip.modeling_clip import CLIPEncoderLayer

from vlp.models.layers.clip import ClipEncoderLayer, ClipTower
from vlp.models.ts2net.model import TS2NetConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread for the module


def both(cfg: TS2NetConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(4)
    theirs = CLIPModel(cfg.to_hf())
    torch.manual_seed(4)
    return theirs, cfg.build_clip()


def test_a_seeded_build_gives_transformers_weights_and_draws_as_many_numbers():
    cfg = TS2NetConfig.tiny(300)
    theirs, mine = both(cfg)
    after_theirs = torch.rand(3)  # both() built theirs, then reseeded and built mine: this follows mine
    torch.manual_seed(4)
    CLIPModel(cfg.to_hf())
    assert torch.equal(torch.rand(3), after_theirs)
    a, b = theirs.state_dict(), mine.state_dict()
    assert list(a) == list(b)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert theirs.config.text_config._attn_implementation == "sdpa"  # the path vlp's arithmetic follows


@pytest.mark.parametrize("pad", [False, True], ids=["full", "padded"])
def test_both_towers_give_transformers_bits_forward_and_backward(pad):
    cfg = TS2NetConfig.tiny(300)
    theirs, mine = both(cfg)
    ids = torch.randint(2, 300, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    if pad:
        mask[1, 6:] = 0
        mask[2, 3:] = 0
    pixels = torch.randn(4, 3, 32, 32)
    got = []
    for module, text, vision in (
        (theirs, lambda m: m.text_model(input_ids=ids, attention_mask=mask).last_hidden_state,
         lambda m: m.vision_model(pixel_values=pixels).last_hidden_state),
        (mine, lambda m: m.text_model(ids, mask), lambda m: m.vision_model(pixels)),
    ):  # fmt: skip
        module.train()
        t = module.text_projection(text(module))
        v = module.visual_projection(module.vision_model.post_layernorm(vision(module)))
        (t.pow(2).sum() + v.pow(3).sum()).backward()
        got.append((t.detach(), v.detach(), {n: p.grad for n, p in module.named_parameters() if p.grad is not None}))
    (ta, va, ga), (tb, vb, gb) = got
    assert torch.equal(ta, tb) and torch.equal(va, vb)
    assert list(ga) == list(gb) and all(torch.equal(ga[k], gb[k]) for k in ga)
    if pad:  # what the mask does, independently of transformers
        mine.eval()
        with torch.no_grad():
            full, masked = mine.text_model(ids, torch.ones_like(mask)), mine.text_model(ids, mask)
        assert torch.allclose(full[2, :3], masked[2, :3], atol=1e-5)  # causal: real tokens never saw what follows
        assert not torch.allclose(full[2, 5], masked[2, 5], atol=1e-3)  # a padded position sees the real keys only


def test_the_aggregators_block_is_transformers_clip_block():
    cfg = TS2NetConfig.tiny(300)
    text = cfg.to_hf().text_config
    text.hidden_size, text.intermediate_size, text.layer_norm_eps = 64, 256, 1e-12
    text._attn_implementation = "sdpa"
    torch.manual_seed(6)
    theirs = CLIPEncoderLayer(text)
    torch.manual_seed(6)
    mine = ClipEncoderLayer(ClipTower(width=64, layers=2, heads=text.num_attention_heads, intermediate=256,
                                      layer_norm_eps=1e-12))  # fmt: skip
    a, b = theirs.state_dict(), mine.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(2, 9, 64, requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    out_a, out_b = theirs(x, None), mine(y)
    out_a = out_a[0] if isinstance(out_a, tuple) else out_a
    (out_a.sum() * 2).backward()
    (out_b.sum() * 2).backward()
    assert torch.equal(out_a, out_b) and torch.equal(x.grad, y.grad)


def test_building_ts2net_imports_no_model_code_of_transformers():
    heavy = ("transformers.modeling_utils", "transformers.masking_utils", "transformers.models.clip.modeling_clip",
             "torch._dynamo", "timm")  # fmt: skip
    code = ("import sys, torch; from vlp.models.ts2net.model import TS2Net, TS2NetConfig; "
            "net = TS2Net(TS2NetConfig.tiny(300)).eval(); "
            "net.encode_text(torch.randint(2, 300, (2, 8)), torch.ones(2, 8, dtype=torch.long)); "
            f"print([m for m in {heavy!r} if m in sys.modules])")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
