"""Rendering: scene textures, anti-aliased shapes, and the frames of one item with every entity's box."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from vlp.data.synth.plan import Entity, ItemPlan
from vlp.data.synth.world import COLORS, SCENES, SHAPES, SIZES

# --------------------------------------------------------------------------- textures


def _value_noise(rng: np.random.Generator, n: int, cells_y: int, cells_x: int) -> np.ndarray:
    """Smooth noise in [0, 1] of shape (n, n): a random grid upsampled with smoothstep interpolation."""
    cells_y, cells_x = max(1, cells_y), max(1, cells_x)
    grid = rng.random((cells_y + 1, cells_x + 1))
    ys, xs = np.linspace(0, cells_y, n, endpoint=False), np.linspace(0, cells_x, n, endpoint=False)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    fy, fx = fy * fy * (3 - 2 * fy), fx * fx * (3 - 2 * fx)
    top = grid[y0][:, x0] * (1 - fx) + grid[y0][:, x0 + 1] * fx
    bottom = grid[y0 + 1][:, x0] * (1 - fx) + grid[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def _fractal(rng: np.random.Generator, n: int, cells: int, octaves: int = 3) -> np.ndarray:
    out = cast(np.ndarray, sum(0.5**o * _value_noise(rng, n, cells * 2**o, cells * 2**o) for o in range(octaves)))
    return out / sum(0.5**o for o in range(octaves))


def _rgb(*c: float) -> np.ndarray:
    return np.array(c, np.float32)


def _tex_grass(rng: np.random.Generator, n: int) -> np.ndarray:
    blotches = _fractal(rng, n, 4) - 0.5
    blades = _value_noise(rng, n, n // 12, n // 2) - 0.5  # thin vertical streaks
    return _rgb(70, 140, 50) + blotches[..., None] * _rgb(30, 60, 25) + blades[..., None] * _rgb(30, 70, 25)


def _tex_sand(rng: np.random.Generator, n: int) -> np.ndarray:
    y = np.arange(n)[:, None] / n
    ripples = np.sin(2 * np.pi * (y * 10 + 0.8 * _fractal(rng, n, 3)))
    grain = rng.normal(0, 7, (n, n))
    return _rgb(212, 188, 140) + (ripples * 12 + grain)[..., None] * _rgb(1, 0.95, 0.8)


def _tex_water(rng: np.random.Generator, n: int) -> np.ndarray:
    y = np.arange(n)[:, None] / n
    waves = np.sin(2 * np.pi * (y * 14 + 1.5 * _fractal(rng, n, 3)))
    glint = np.clip(waves - 0.8, 0, None) * 5  # bright crests
    return _rgb(35, 95, 170) + waves[..., None] * _rgb(8, 15, 20) + glint[..., None] * _rgb(60, 70, 60)


def _tex_snow(rng: np.random.Generator, n: int) -> np.ndarray:
    drifts = _fractal(rng, n, 4) - 0.5
    shadow = np.clip(_value_noise(rng, n, 2, 6) - 0.6, 0, None) * 2.5  # soft blue-grey hollows
    sparkle = (rng.random((n, n)) < 0.02) * 10.0
    img = _rgb(238, 241, 248) + drifts[..., None] * _rgb(40, 34, 18) + sparkle[..., None]
    return img - shadow[..., None] * _rgb(60, 45, 15)


def _tex_sky(rng: np.random.Generator, n: int) -> np.ndarray:
    t = (np.arange(n)[:, None] / n)[..., None]
    base = _rgb(85, 145, 225) * (1 - t) + _rgb(160, 200, 245) * t
    clouds = np.clip((_fractal(rng, n, 3) - 0.55) * 4, 0, 1)[..., None]
    return base * (1 - clouds) + _rgb(250, 250, 252) * clouds


def _tex_road(rng: np.random.Generator, n: int) -> np.ndarray:
    img = _rgb(78, 78, 82) + (rng.normal(0, 8, (n, n)) + 20 * (_fractal(rng, n, 4) - 0.5))[..., None]
    y, x = np.arange(n)[:, None], np.arange(n)[None, :]
    width, dash = max(1, n // 64), max(4, n // 10)
    lane = np.zeros((n, n), bool)
    for row in (n // 4, 3 * n // 4):  # two lanes, so any crop of half the texture shows one
        lane |= (np.abs(y - row) <= width) & ((x // dash) % 2 == 0)
    img[lane] = _rgb(205, 205, 190)
    return img


def _tex_brick_wall(rng: np.random.Generator, n: int) -> np.ndarray:
    bh = max(4, n // 14)
    bw = 2 * bh
    y, x = np.arange(n)[:, None], np.arange(n)[None, :]
    shifted = x + ((y // bh) % 2) * (bw // 2)
    tone = rng.random((n // bh + 1, n // bw + 2))[y // bh, shifted // bw]
    brick = _rgb(150, 62, 45) * (0.85 + 0.3 * tone)[..., None] + rng.normal(0, 6, (n, n))[..., None]
    mortar = (y % bh == 0) | (shifted % bw == 0)
    brick[mortar] = _rgb(185, 180, 170)
    return brick


def _tex_wooden_floor(rng: np.random.Generator, n: int) -> np.ndarray:
    pw = max(5, n // 9)
    x = np.arange(n)[None, :]
    tone = rng.random(n // pw + 1)[np.broadcast_to(x // pw, (n, n))]
    grain = np.sin(2 * np.pi * (x / n * 45 + 2.5 * _value_noise(rng, n, n // 6, 3)))
    wood = _rgb(150, 100, 60) * (0.8 + 0.35 * tone)[..., None] + (grain * 8)[..., None]
    wood[np.broadcast_to(x % pw == 0, (n, n))] = _rgb(95, 62, 36)
    return wood


_TEXTURES: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "grass": _tex_grass,
    "sand": _tex_sand,
    "water": _tex_water,
    "snow": _tex_snow,
    "sky": _tex_sky,
    "road": _tex_road,
    "brick wall": _tex_brick_wall,
    "wooden floor": _tex_wooden_floor,
}


@functools.lru_cache(maxsize=32)
def scene_texture(scene: str, size: int, seed: int) -> np.ndarray:
    """The (2*size, 2*size, 3) uint8 texture of ``scene``; items crop a size x size window of it."""
    rng = np.random.default_rng([seed, 7919, SCENES.index(scene)])
    tex = _TEXTURES[scene](rng, 2 * size)
    tex = np.clip(np.rint(tex), 0, 255).astype(np.uint8)
    tex.setflags(write=False)
    return tex


# --------------------------------------------------------------------------- shapes and rendering


def _in_polygon(u: np.ndarray, v: np.ndarray, pts: Sequence[tuple[float, float]]) -> np.ndarray:
    """Even-odd rule point-in-polygon test, vectorised over the sample grid."""
    inside = np.zeros(u.shape, bool)
    for (x1, y1), (x2, y2) in zip(pts, [*pts[1:], pts[0]], strict=True):
        crosses = (y1 > v) != (y2 > v)
        x_at = (x2 - x1) * (v - y1) / ((y2 - y1) or 1e-12) + x1
        inside ^= crosses & (u < x_at)
    return inside


def _star_points() -> list[tuple[float, float]]:
    angles = -np.pi / 2 + np.arange(10) * np.pi / 5
    radii = np.where(np.arange(10) % 2 == 0, 1.0, 0.48)
    return [(float(r * np.cos(a)), float(r * np.sin(a) + 0.08)) for r, a in zip(radii, angles, strict=True)]


def _inside(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Whether points (u, v) in [-1, 1]^2 (v pointing down) lie inside ``shape``."""
    if shape == "circle":
        return u**2 + v**2 <= 1
    if shape == "square":
        return (np.abs(u) <= 0.88) & (np.abs(v) <= 0.88)
    if shape == "triangle":
        return _in_polygon(u, v, [(0.0, -0.95), (0.98, 0.8), (-0.98, 0.8)])
    if shape == "star":
        return _in_polygon(u, v, _star_points())
    if shape == "heart":
        lobes = ((np.abs(u) - 0.48) ** 2 + (v + 0.45) ** 2) <= 0.5**2
        return lobes | _in_polygon(u, v, [(-0.95, -0.25), (0.95, -0.25), (0.0, 0.98)])
    if shape == "cross":
        return ((np.abs(u) <= 0.34) & (np.abs(v) <= 0.95)) | ((np.abs(v) <= 0.34) & (np.abs(u) <= 0.95))
    if shape == "ring":
        r2 = u**2 + v**2
        return (r2 <= 1) & (r2 >= 0.5**2)
    if shape == "diamond":
        return np.abs(u) + np.abs(v) <= 1
    raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


@functools.lru_cache(maxsize=256)
def shape_mask(shape: str, px: int) -> np.ndarray:
    """Anti-aliased coverage in [0, 1] of ``shape`` on a (px, px) grid (4x4 supersampling)."""
    ss = 4
    t = (np.arange(px * ss) + 0.5) / (px * ss) * 2 - 1
    u, v = np.meshgrid(t, t)
    alpha = _inside(shape, u, v).reshape(px, ss, px, ss).mean(axis=(1, 3)).astype(np.float32)
    alpha.setflags(write=False)
    return alpha


def _mask_extent(alpha: np.ndarray) -> tuple[int, int, int, int]:
    """(col0, row0, col1, row1), exclusive ends, of the pixels the mask covers at all."""
    rows, cols = np.nonzero(alpha.any(axis=1))[0], np.nonzero(alpha.any(axis=0))[0]
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def _object_px(ent: Entity, size: int) -> int:
    return max(3, round(SIZES[ent.size] * size))


def render(plan: ItemPlan, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw every frame of ``plan``.

    Returns:
        frames: uint8 (T, size, size, 3) RGB.
        boxes: float32 (T, K, 4) normalised (x0, y0, x1, y1) of each entity, clipped to [0, 1].
    """
    r, c = plan.crop
    background = scene_texture(plan.scene, size, seed)[r : r + size, c : c + size].astype(np.float32)
    frames = np.empty((plan.num_frames, size, size, 3), np.uint8)
    boxes = np.zeros((plan.num_frames, len(plan.entities), 4), np.float32)
    # Big objects first, so small ones stay visible on top of them.
    order = sorted(range(len(plan.entities)), key=lambda k: -SIZES[plan.entities[k].size])
    steps = np.linspace(0.0, 1.0, plan.num_frames) if plan.num_frames > 1 else np.zeros(1)
    for t, step in enumerate(steps):
        frame = background.copy()
        for k in order:
            ent = plan.entities[k]
            px = _object_px(ent, size)
            cx = (plan.starts[k][0] + step * plan.moves[k][0]) * size
            cy = (plan.starts[k][1] + step * plan.moves[k][1]) * size
            left, top = round(cx - px / 2), round(cy - px / 2)
            boxes[t, k] = _paste(frame, shape_mask(ent.shape, px), COLORS[ent.color], left, top)
        frames[t] = np.clip(np.rint(frame), 0, 255).astype(np.uint8)
    return frames, boxes


def _paste(frame: np.ndarray, alpha: np.ndarray, color: tuple[int, int, int], left: int, top: int) -> np.ndarray:
    """Alpha-blend ``color`` through ``alpha`` at (left, top), in place; returns the clipped box."""
    size, px = frame.shape[0], alpha.shape[0]
    x0, y0, x1, y1 = max(0, left), max(0, top), min(size, left + px), min(size, top + px)
    if x1 > x0 and y1 > y0:
        a = alpha[y0 - top : y1 - top, x0 - left : x1 - left, None]
        region = frame[y0:y1, x0:x1]
        region *= 1 - a
        region += a * np.asarray(color, np.float32)
    e0, f0, e1, f1 = _mask_extent(alpha)
    box = np.array([left + e0, top + f0, left + e1, top + f1], np.float32) / size
    return np.clip(box, 0.0, 1.0)
