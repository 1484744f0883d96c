"""TimeSformer video encoder: shapes, gradients, a naive reference block, ViT weight mapping, interpolation."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed
from torch import Tensor

from vlp.models.layers.timesformer import (
    DividedSTBlock,
    TimeSformer,
    TimeSformerConfig,
    VideoEncoderOutput,
    load_vit_weights,
)


def tiny_vit(img_size: int = 32, depth: int = 2, width: int = 64) -> torch.nn.Module:
    """A random timm ViT with the tiny TimeSformer's sizes."""
    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=img_size, patch_size=8, embed_dim=width, depth=depth,
        num_heads=2, num_classes=5,
    )  # fmt: skip
    return vit.eval()


@pytest.fixture(scope="module")
def vit_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    vit = tiny_vit()
    path = tmp_path_factory.mktemp("vit") / "vit.safetensors"
    save_file({k: v.contiguous() for k, v in vit.state_dict().items()}, str(path))
    return vit, path


def randomise_temporal(model: torch.nn.Module, seed: int = 1) -> None:
    """Give temporal_fc and time_embed non-zero values so the temporal path matters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "temporal_fc" in name or name == "time_embed":
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


# ----------------------------------------------------------------------------------------------- shapes, errors


@pytest.mark.parametrize(
    ("frames", "height", "width"), [(1, 32, 32), (2, 32, 32), (3, 48, 48), (5, 16, 16), (2, 32, 48)]
)
def test_token_count_is_one_plus_grid_whatever_the_frame_count(frames: int, height: int, width: int) -> None:
    torch.manual_seed(0)
    model = TimeSformer(TimeSformerConfig.tiny()).eval()
    out = model(torch.randn(2, frames, 3, height, width))
    grid = (height // 8, width // 8)
    assert isinstance(out, VideoEncoderOutput)
    assert out.grid == grid
    assert out.tokens.shape == (2, 1 + grid[0] * grid[1], 64)
    assert out.frame_tokens.shape == (2, frames, grid[0] * grid[1], 64)
    assert torch.isfinite(out.tokens).all()
    torch.testing.assert_close(out.tokens[:, 1:], out.frame_tokens.mean(dim=1))


def test_paper_preset_gives_197_tokens_at_224_px() -> None:
    cfg = TimeSformerConfig.paper()
    assert (cfg.img_size, cfg.patch_size, cfg.width, cfg.depth, cfg.heads, cfg.num_frames) == (224, 16, 768, 12, 12, 4)
    assert cfg.drop_path == 0.1 and "in21k" in cfg.init
    model = TimeSformer(TimeSformerConfig.paper(depth=1, init="")).eval()  # init="": no hub download in tests
    with torch.no_grad():
        for frames in (1, 3):
            assert model(torch.randn(1, frames, 3, 224, 224)).tokens.shape == (1, 197, 768)


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((2, 3, 32, 32), r"\(B, T, 3, H, W\)"),
        ((2, 2, 1, 32, 32), r"\(B, T, 3, H, W\)"),
        ((2, 3, 4, 32, 32), "channels-first"),
        ((2, 2, 3, 30, 32), "multiples of the patch size 8"),
        ((2, 2, 3, 32, 4), "multiples of the patch size 8"),
        ((2, 0, 3, 32, 32), "T >= 1"),
    ],
)
def test_wrong_input_shape_raises_a_clear_error(shape: tuple[int, ...], match: str) -> None:
    model = TimeSformer(TimeSformerConfig.tiny())
    with pytest.raises(ValueError, match=match):
        model(torch.randn(shape))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"img_size": 30}, "multiple of patch_size"),
        ({"heads": 3}, "divisible by heads"),
        ({"num_frames": 0}, "num_frames"),
        ({"drop_path": 1.0}, "drop_path"),
        ({"pos_interp": "linear"}, "pos_interp"),
        ({"time_interp": "bicubic"}, "time_interp"),
    ],
)
def test_invalid_config_is_rejected(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TimeSformerConfig.tiny(**overrides)


# --------------------------------------------------------------------------------------- gradients, checkpointing


def test_every_parameter_gets_a_nonzero_gradient_and_no_nan() -> None:
    torch.manual_seed(0)
    model = TimeSformer(TimeSformerConfig.tiny()).train()
    video, probe = torch.randn(2, 3, 3, 32, 32), torch.randn(2, 17, 64)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    (model(video).tokens * probe).sum().backward()
    fc_grads = [b.temporal_fc.weight.grad for b in model.blocks]
    assert all(g is not None and g.abs().sum() > 0 for g in fc_grads), "zero-initialised temporal_fc must learn"
    opt.step()  # temporal_fc is now non-zero, so the temporal attention weights get gradient too
    opt.zero_grad()
    out = model(video)
    (out.tokens * probe).sum().backward()
    assert torch.isfinite(out.tokens).all()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    zero = [n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() == 0]
    assert not missing, f"parameters without a finite gradient: {missing}"
    assert not zero, f"parameters with an all-zero gradient: {zero}"


def test_gradient_checkpointing_gives_the_same_output_and_gradients() -> None:
    torch.manual_seed(0)
    plain = TimeSformer(TimeSformerConfig.tiny(drop_path=0.3)).train()
    randomise_temporal(plain)
    ckpt = TimeSformer(TimeSformerConfig.tiny(drop_path=0.3, grad_checkpointing=True)).train()
    ckpt.load_state_dict(plain.state_dict())
    calls = []
    ckpt.blocks[0].register_forward_pre_hook(lambda *_: calls.append(1))  # recompute may stop early
    video, probe = torch.randn(3, 2, 3, 32, 32), torch.randn(3, 17, 64)
    results = []
    for model in (plain, ckpt):
        torch.manual_seed(123)  # same drop-path masks in both runs
        out = model(video).tokens
        (out * probe).sum().backward()
        results.append((out, {n: p.grad for n, p in model.named_parameters()}))
    assert len(calls) == 2, "the checkpointed block must be recomputed in backward"
    torch.testing.assert_close(results[0][0], results[1][0])
    for name, grad in results[0][1].items():
        torch.testing.assert_close(grad, results[1][1][name], msg=name)


# ------------------------------------------------------------------------------------------ reference block


def _ref_attention(attn: torch.nn.Module, x: Tensor) -> Tensor:
    """Multi-head self-attention over x (L, C), head by head, from the explicit formula."""
    C, H = x.shape[-1], attn.num_heads
    d = C // H
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).split(C, dim=-1)
    heads = []
    for h in range(H):
        sl = slice(h * d, (h + 1) * d)
        weights = torch.softmax(q[:, sl] @ k[:, sl].T / math.sqrt(d), dim=-1)
        heads.append(weights @ v[:, sl])
    return F.linear(torch.cat(heads, dim=-1), attn.proj.weight, attn.proj.bias)


def _ref_block(blk: DividedSTBlock, cls: Tensor, patches: Tensor) -> tuple[Tensor, Tensor]:
    """Divided space-time attention written with loops over videos, patch positions and frames."""

    def ln(norm: torch.nn.Module, x: Tensor) -> Tensor:
        return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, eps=1e-6)

    def mlp(x: Tensor) -> Tensor:
        return F.linear(F.gelu(F.linear(x, blk.mlp.fc1.weight, blk.mlp.fc1.bias)), blk.mlp.fc2.weight, blk.mlp.fc2.bias)

    B, T, N, _ = patches.shape
    out_cls, out_patches = [], []
    for b in range(B):
        cols = []
        for n in range(N):  # temporal attention at one patch position
            seq = patches[b, :, n]  # (T, C)
            res = F.linear(
                _ref_attention(blk.temporal_attn, ln(blk.temporal_norm1, seq)), *blk.temporal_fc.parameters()
            )
            cols.append(seq + res)
        xt = torch.stack(cols, dim=1)  # (T, N, C)
        cls_updates, frames = [], []
        for t in range(T):  # spatial attention inside one frame, with the video [CLS]
            seq = torch.cat([cls[b], xt[t]], dim=0)  # (1+N, C)
            res = _ref_attention(blk.attn, ln(blk.norm1, seq))
            cls_updates.append(res[0])
            frames.append(xt[t] + res[1:])
        c = cls[b, 0] + torch.stack(cls_updates).mean(dim=0)  # (C,)
        p = torch.stack(frames)  # (T, N, C)
        out_cls.append((c + mlp(ln(blk.norm2, c)))[None])
        out_patches.append(p + mlp(ln(blk.norm2, p)))
    return torch.stack(out_cls), torch.stack(out_patches)


def test_block_matches_a_loop_reference_in_value_and_gradient() -> None:
    torch.manual_seed(0)
    blk = DividedSTBlock(16, 2, mlp_ratio=2.0).double()
    with torch.no_grad():
        for p in blk.parameters():
            p.copy_(0.3 * torch.randn_like(p))  # includes a non-zero temporal_fc
    cls = torch.randn(2, 1, 16, dtype=torch.float64, requires_grad=True)
    patches = torch.randn(2, 3, 4, 16, dtype=torch.float64, requires_grad=True)  # T=3, N=4: T and N distinct
    probe_c, probe_p = torch.randn(2, 1, 16, dtype=torch.float64), torch.randn(2, 3, 4, 16, dtype=torch.float64)
    grads = []
    for fn in (blk, lambda c, p: _ref_block(blk, c, p)):
        c_out, p_out = fn(cls, patches)
        assert c_out.shape == (2, 1, 16) and p_out.shape == (2, 3, 4, 16)
        inputs = (cls, patches, *blk.parameters())
        grads.append(((c_out, p_out), torch.autograd.grad((c_out * probe_c).sum() + (p_out * probe_p).sum(), inputs)))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for g_fast, g_ref in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(g_fast, g_ref)


# ------------------------------------------------------------------------------------------ ViT weight mapping


@pytest.mark.parametrize("frames", [1, 3])
def test_static_clip_reproduces_the_vit_after_loading(vit_file: tuple[torch.nn.Module, Path], frames: int) -> None:
    vit, path = vit_file
    model = TimeSformer(TimeSformerConfig.tiny(init=str(path))).eval()
    for blk, vblk in zip(model.blocks, vit.blocks, strict=True):
        torch.testing.assert_close(blk.temporal_attn.qkv.weight, vblk.attn.qkv.weight)
        torch.testing.assert_close(blk.temporal_norm1.weight, vblk.norm1.weight)
        assert blk.temporal_fc.weight.abs().sum() == 0 and blk.temporal_fc.bias.abs().sum() == 0
    assert model.time_embed.abs().sum() == 0
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = vit.forward_features(images)  # (2, 1+16, 64)
        out = model(images[:, None].expand(2, frames, 3, 32, 32))
    torch.testing.assert_close(out.tokens, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.frame_tokens[:, -1], expected[:, 1:], atol=1e-5, rtol=1e-5)


def test_torch_checkpoint_wrapped_and_prefixed_loads_like_safetensors(
    vit_file: tuple[torch.nn.Module, Path], tmp_path: Path
) -> None:
    vit, st_path = vit_file
    pth = tmp_path / "vit.pth"
    torch.save({"model": {f"module.{k}": v for k, v in vit.state_dict().items()}}, pth)
    a, b = TimeSformer(TimeSformerConfig.tiny()), TimeSformer(TimeSformerConfig.tiny())
    assert load_vit_weights(a, st_path) == ["head.bias", "head.weight"]
    load_vit_weights(b, pth)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(pa, pb, msg=name)


@pytest.mark.parametrize(("img_size", "mode"), [(48, "bicubic"), (16, "bicubic"), (64, "bilinear")])
def test_pos_embed_is_resampled_over_the_patch_grid(
    vit_file: tuple[torch.nn.Module, Path], img_size: int, mode: str
) -> None:
    vit, path = vit_file
    model = TimeSformer(TimeSformerConfig.tiny(img_size=img_size, init=str(path), pos_interp=mode))
    g = img_size // 8
    reference = resample_abs_pos_embed(vit.pos_embed.detach(), [g, g], num_prefix_tokens=1, interpolation=mode)
    assert model.pos_embed.shape == (1, 1 + g * g, 64)
    torch.testing.assert_close(model.pos_embed[:, 0], vit.pos_embed[:, 0])  # class position kept
    torch.testing.assert_close(model.pos_embed.detach(), reference)
    assert torch.isfinite(model(torch.randn(1, 2, 3, img_size, img_size)).tokens).all()


def test_nearest_pos_embed_repeats_each_patch_position(vit_file: tuple[torch.nn.Module, Path]) -> None:
    vit, path = vit_file
    model = TimeSformer(TimeSformerConfig.tiny(img_size=64, init=str(path), pos_interp="nearest"))
    old = vit.pos_embed[0, 1:].reshape(4, 4, 64)
    new = model.pos_embed.detach()[0, 1:].reshape(8, 8, 64)
    for i in range(8):
        for j in range(8):
            torch.testing.assert_close(new[i, j], old[i // 2, j // 2])


@pytest.mark.parametrize(
    ("frames", "mode", "expected"),
    [
        (4, "linear", [1.0, 1.5, 2.5, 3.0]),  # align_corners=False: source points -0.25, 0.25, 0.75, 1.25 (clamped)
        (3, "linear", [1.0, 2.0, 3.0]),
        (4, "nearest", [1.0, 1.0, 3.0, 3.0]),
        (1, "linear", [2.0]),
    ],
)
def test_time_embed_is_interpolated_when_the_frame_count_differs(
    tmp_path: Path, frames: int, mode: str, expected: list[float]
) -> None:
    source = TimeSformer(TimeSformerConfig.tiny(num_frames=2))
    randomise_temporal(source)
    with torch.no_grad():
        source.time_embed.copy_(torch.tensor([1.0, 3.0])[None, :, None].expand(1, 2, 64))
    path = tmp_path / "timesformer.safetensors"
    save_file(source.state_dict(), str(path))
    model = TimeSformer(TimeSformerConfig.tiny(num_frames=frames, time_interp=mode, init=str(path)))
    torch.testing.assert_close(model.time_embed.detach(), torch.tensor(expected)[None, :, None].expand(1, frames, 64))
    # a TimeSformer checkpoint keeps its own temporal weights (no copy from the spatial ones, no zeroing)
    torch.testing.assert_close(model.blocks[1].temporal_fc.weight, source.blocks[1].temporal_fc.weight)


def test_on_the_fly_resizing_matches_a_model_loaded_at_that_size(tmp_path: Path) -> None:
    torch.manual_seed(0)
    small = TimeSformer(TimeSformerConfig.tiny(num_frames=2)).eval()
    randomise_temporal(small)
    path = tmp_path / "small.safetensors"
    save_file(small.state_dict(), str(path))
    large = TimeSformer(TimeSformerConfig.tiny(img_size=48, num_frames=4, init=str(path))).eval()
    video = torch.randn(2, 4, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(small(video).tokens, large(video).tokens)
        # the temporal path is live: reversing the frames changes the output
        assert not torch.allclose(small(video).tokens, small(video.flip(1)).tokens, atol=1e-4)


# ------------------------------------------------------------------------------------------ loading errors


class NotATensor:
    """An arbitrary object that must never be unpickled from a checkpoint."""


def test_loading_errors_are_clear(vit_file: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    model = TimeSformer(TimeSformerConfig.tiny())
    with pytest.raises(FileNotFoundError, match="not a file"):
        load_vit_weights(model, tmp_path / "missing.safetensors")
    with pytest.raises(RuntimeError, match="local path"):
        load_vit_weights(model, "no_such_timm_model_xyz")
    with pytest.raises(RuntimeError, match="local path"):
        TimeSformer(TimeSformerConfig.tiny(init="no_such_timm_model_xyz"))
    pickled = tmp_path / "evil.pth"
    torch.save({"w": NotATensor()}, pickled)
    with pytest.raises(ValueError, match="weights_only"):
        load_vit_weights(model, pickled)
    wide = tmp_path / "wide.safetensors"
    save_file({k: v.contiguous() for k, v in tiny_vit(width=32).state_dict().items()}, str(wide))
    with pytest.raises(ValueError, match="shape mismatches"):
        load_vit_weights(model, wide)
    deep = tmp_path / "deep.safetensors"
    save_file({k: v.contiguous() for k, v in tiny_vit(depth=3).state_dict().items()}, str(deep))
    with pytest.raises(ValueError, match=r"cannot hold: \['blocks.2"):
        load_vit_weights(model, deep)
    _, path = vit_file
    with pytest.raises(ValueError, match="missing"):
        load_vit_weights(TimeSformer(TimeSformerConfig.tiny(depth=3)), path)


def test_random_init_starts_with_an_identity_temporal_path() -> None:
    torch.manual_seed(0)
    model = TimeSformer(TimeSformerConfig.tiny(depth=3)).eval()
    assert all(b.temporal_fc.weight.abs().sum() == 0 and b.temporal_fc.bias.abs().sum() == 0 for b in model.blocks)
    assert model.time_embed.abs().sum() == 0
    image = torch.randn(2, 1, 3, 32, 32)
    with torch.no_grad():  # a static clip then encodes like its single frame, whatever T
        torch.testing.assert_close(model(image).tokens, model(image.expand(2, 4, 3, 32, 32)).tokens)


# ------------------------------------------------------------------------------------ hub revisions and lineage


def test_a_timm_name_loads_its_hub_repo_at_a_revision_and_records_the_commit(
    vit_file: tuple[torch.nn.Module, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """timm's ``vit_tiny_patch16_224.augreg_in21k`` lives in ``timm/vit_tiny_patch16_224.augreg_in21k``: an offline
    cache holding the tiny ViT there (main) and another at tag ``v2`` stands in for the hub."""
    from hub_cache import add_snapshot, commit_sha, offline_hub
    from vlp.models.tokenizer import upstream_of

    cache = offline_hub(monkeypatch, tmp_path)
    name, repo = "vit_tiny_patch16_224.augreg_in21k", "timm/vit_tiny_patch16_224.augreg_in21k"
    vit, path = vit_file
    other = tiny_vit()
    with torch.no_grad():
        other.patch_embed.proj.weight.add_(1.0)
    main, v2 = commit_sha("vit main"), commit_sha("vit v2")
    (tmp_path / "main").mkdir()
    (tmp_path / "main" / "model.safetensors").write_bytes(path.read_bytes())
    (tmp_path / "v2").mkdir()
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(tmp_path / "v2" / "model.safetensors"))
    add_snapshot(cache, repo, tmp_path / "main", commit=main)
    add_snapshot(cache, repo, tmp_path / "v2", commit=v2, refs=("v2",))

    for revision, want, commit in (("", vit, main), ("v2", other, v2), (main, vit, main)):
        model = TimeSformer(TimeSformerConfig.tiny(init=name, init_revision=revision))
        assert torch.equal(model.patch_embed.proj.weight, want.patch_embed.proj.weight), revision
        assert upstream_of(name, revision) == {
            "source": name, "repo": repo, "revision": revision or "main", "commit": commit, "file": "model.safetensors"
        }  # fmt: skip
    with pytest.raises(RuntimeError, match=rf"revision 'v3' is not in the local cache .*main={main}.*local path"):
        TimeSformer(TimeSformerConfig.tiny(init=name, init_revision="v3"))
    with pytest.raises(ValueError, match="is a path, not a hub name"):
        load_vit_weights(TimeSformer(TimeSformerConfig.tiny()), path, revision="v2")
    with pytest.raises(ValueError, match="init_revision='v2' needs init"):
        TimeSformerConfig.tiny(init_revision="v2")
    TimeSformer(TimeSformerConfig.tiny(init=str(path)))
    assert upstream_of(str(path)) == {"source": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
