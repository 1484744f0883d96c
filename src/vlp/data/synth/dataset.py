"""The synthetic video world: coloured shapes moving over textured scenes, with text and ground truth.

:func:`generate` writes, deterministically for a given ``(seed, config)``:

- ``videos/<video_id>.mp4``: h264 clips of 1-3 objects (shape x colour x size), each moving in
  a straight line in its own direction over a textured background scene;
- ``images/<video_id>.jpg``: still images of the same world (``media="image"``), for the
  image-text branch that repeats a still into a static video;
- ``videos.parquet``, ``captions.parquet``, ``qa.parquet``, ``boxes.parquet``: the manifests of
  :mod:`vlp.data.manifest`. Captions paraphrase each clip with varied templates and synonyms;
  QA pairs cover the answer types of :data:`vlp.data.manifest.ANSWER_TYPES`; boxes give every
  entity's box on every frame under its canonical name ``"<colour> <shape>"``.

Every item draws its random numbers from its own generator seeded by ``(seed, media, index)``,
and each encoder runs single-threaded (x264 without its AVX-512 kernels: :func:`x264_asm`), so the
bytes of every file are the same whatever the number of worker processes. Caption synonyms are
listed in :data:`SHAPE_SYNONYMS` (and the other ``*_PHRASES`` tables) so that a consumer can map a
caption word back to a canonical name.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from vlp import storage
from vlp.data import manifest
from vlp.data.manifest import BOX_SCHEMA as BOX
from vlp.data.manifest import CAPTION_SCHEMA as CAPTION
from vlp.data.manifest import RAW_VIDEO_SCHEMA as RAW_VIDEO

# --------------------------------------------------------------------------- vocabulary

SHAPES = ("circle", "square", "triangle", "star", "heart", "cross", "ring", "diamond")
# Nouns a caption may use for each shape; the first is the canonical name (used in boxes and answers).
SHAPE_SYNONYMS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "disc", "ball"),
    "square": ("square", "box", "block"),
    "triangle": ("triangle",),
    "star": ("star",),
    "heart": ("heart",),
    "cross": ("cross", "plus sign"),
    "ring": ("ring", "hoop", "donut"),
    "diamond": ("diamond", "rhombus"),
}
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (40, 180, 60),
    "blue": (30, 70, 220),
    "yellow": (245, 215, 30),
    "orange": (245, 135, 20),
    "purple": (140, 50, 180),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
    "pink": (250, 120, 190),
}
# Object side as a fraction of the frame side.
SIZES: dict[str, float] = {"small": 0.18, "medium": 0.26, "large": 0.36}
SIZE_PHRASES: dict[str, tuple[str, ...]] = {
    "small": ("small", "tiny", "little"),
    "medium": ("medium", "medium-sized", "mid-sized"),
    "large": ("large", "big", "huge"),
}
# Unit motion vectors in image coordinates (x right, y down).
_D = 2**-0.5
DIRECTIONS: dict[str, tuple[float, float]] = {
    "left": (-1.0, 0.0),
    "right": (1.0, 0.0),
    "up": (0.0, -1.0),
    "down": (0.0, 1.0),
    "up-left": (-_D, -_D),
    "up-right": (_D, -_D),
    "down-left": (-_D, _D),
    "down-right": (_D, _D),
}
DIRECTION_PHRASES: dict[str, tuple[str, ...]] = {
    "left": ("to the left", "off to the left", "towards the left"),
    "right": ("to the right", "off to the right", "towards the right"),
    "up": ("upward", "up", "towards the top"),
    "down": ("downward", "down", "towards the bottom"),
    "up-left": ("up and to the left", "diagonally up and left", "towards the upper left"),
    "up-right": ("up and to the right", "diagonally up and right", "towards the upper right"),
    "down-left": ("down and to the left", "diagonally down and left", "towards the lower left"),
    "down-right": ("down and to the right", "diagonally down and right", "towards the lower right"),
}
SCENES = ("grass", "sand", "water", "snow", "sky", "road", "brick wall", "wooden floor")
SCENE_PHRASES: dict[str, tuple[str, ...]] = {
    "grass": ("the grass", "a lawn", "a grassy field"),
    "sand": ("the sand", "a sandy beach", "desert sand"),
    "water": ("the water", "a lake", "the sea"),
    "snow": ("the snow", "a snowy field", "fresh snow"),
    "sky": ("the sky", "a blue sky", "the clouds"),
    "road": ("the road", "a street", "the asphalt"),
    "brick wall": ("a brick wall", "a wall of bricks", "red bricks"),
    "wooden floor": ("a wooden floor", "the floorboards", "wooden planks"),
}
# Prepositions that read naturally before each scene phrase.
SCENE_PREPS: dict[str, tuple[str, ...]] = {
    "grass": ("over", "across", "on"),
    "sand": ("over", "across", "on"),
    "water": ("over", "across", "on"),
    "snow": ("over", "across", "on"),
    "sky": ("across", "in"),
    "road": ("over", "along", "on"),
    "brick wall": ("on", "along", "against"),
    "wooden floor": ("over", "across", "on"),
}
# Colours that would blend into a scene's texture are never drawn on it.
SCENE_EXCLUDED_COLORS: dict[str, tuple[str, ...]] = {
    "grass": ("green",),
    "sand": ("yellow", "orange"),
    "water": ("blue",),
    "snow": ("white",),
    "sky": ("blue", "white"),
    "road": ("black", "white"),
    "brick wall": ("red", "orange"),
    "wooden floor": ("orange",),
}
_COUNT_WORDS = ("zero", "one", "two", "three", "four", "five", "six")
_MEDIA_CODE = {"video": 0, "image": 1}


# --------------------------------------------------------------------------- config


@dataclass
class SynthConfig:
    """Size and look of the synthetic world. Same (seed, config) -> byte-identical output."""

    num_videos: int = 40  # number of mp4 clips
    num_images: int | None = None  # number of still images; None = num_videos // 4
    seed: int = 0  # master seed; every item derives its own from (seed, media, index)
    size: int = 224  # frame side in pixels (square, even: h264 needs even sides)
    min_duration_s: float = 2.0  # shortest clip, seconds
    max_duration_s: float = 4.0  # longest clip, seconds
    min_fps: int = 10  # lowest frame rate (integer fps drawn per clip)
    max_fps: int = 15  # highest frame rate
    min_objects: int = 1  # fewest objects per clip or image
    max_objects: int = 3  # most objects per clip or image (distinct shapes and colours)
    captions_per_video: int = 5  # distinct paraphrased captions per clip or image
    color_mention: float = 1.0  # chance that a caption names an object's colour (1.0: always; see captions_for)
    qa_per_video: int = 5  # question/answer pairs per clip or image (cycles through the answer types)
    val_fraction: float = 0.1  # share of items in the "val" split
    test_fraction: float = 0.1  # share of items in the "test" split (the rest is "train")
    crf: int = 23  # libx264 constant rate factor (lower = better quality, bigger files)
    jpeg_quality: int = 90  # JPEG quality of the still images (1-95)
    workers: int = 2  # rendering processes; 1 renders in this process (output does not depend on it)

    def resolved_num_images(self) -> int:
        """The number of still images actually written."""
        return self.num_videos // 4 if self.num_images is None else self.num_images

    def validate(self) -> None:
        """Raise ``ValueError`` naming the ``synth.*`` key that is out of range and how to fix it."""
        checks = [
            (self.num_videos >= 0, "synth.num_videos must be >= 0"),
            (self.resolved_num_images() >= 0, "synth.num_images must be >= 0 (or null for num_videos // 4)"),
            (self.size >= 16 and self.size % 2 == 0, f"synth.size={self.size}: use an even number >= 16"),
            (0 < self.min_duration_s <= self.max_duration_s, "synth.min_duration_s must be > 0 and <= max_duration_s"),
            (1 <= self.min_fps <= self.max_fps, "synth.min_fps must be >= 1 and <= synth.max_fps"),
            (1 <= self.min_objects <= self.max_objects, "synth.min_objects must be >= 1 and <= max_objects"),
            (self.max_objects <= _max_objects(), f"synth.max_objects must be <= {_max_objects()}"),
            (self.captions_per_video >= 1, "synth.captions_per_video must be >= 1"),
            (0.0 <= self.color_mention <= 1.0, "synth.color_mention must be in [0, 1]"),
            (self.qa_per_video >= 0, "synth.qa_per_video must be >= 0"),
            (self.val_fraction >= 0 and self.test_fraction >= 0, "synth.val/test_fraction must be >= 0"),
            (self.val_fraction + self.test_fraction < 1, "synth.val_fraction + synth.test_fraction must be < 1"),
            (0 <= self.crf <= 51, "synth.crf must be in [0, 51]"),
            (1 <= self.jpeg_quality <= 95, "synth.jpeg_quality must be in [1, 95]"),
            (self.workers >= 1, "synth.workers must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid synth config: {message}")
        if round(self.min_duration_s * self.min_fps) < 2:
            raise ValueError("invalid synth config: clips need >= 2 frames; raise synth.min_duration_s or min_fps")


def _max_objects() -> int:
    """Objects have distinct colours, so the fewest colours any scene allows bounds their number."""
    fewest = min(len(COLORS) - len(excluded) for excluded in SCENE_EXCLUDED_COLORS.values())
    return min(fewest, len(SHAPES), len(_COUNT_WORDS) - 1)


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Entity:
    """One object of an item. ``direction`` is empty for still images."""

    shape: str
    color: str
    size: str
    direction: str

    @property
    def name(self) -> str:
        """The canonical noun phrase, e.g. ``"red circle"``."""
        return f"{self.color} {self.shape}"


@dataclass(frozen=True)
class ItemPlan:
    """Everything random about one clip or still, drawn before any pixel is rendered."""

    video_id: str
    media: str  # "video" | "image"
    index: int
    split: str
    scene: str
    fps: int  # 0 for stills
    num_frames: int  # 1 for stills
    crop: tuple[int, int]  # (row, col) offset into the scene texture
    entities: tuple[Entity, ...]
    starts: tuple[tuple[float, float], ...]  # object centres (x, y) in [0, 1] on the first frame
    moves: tuple[tuple[float, float], ...]  # (dx, dy) covered from the first to the last frame

    @property
    def rel_path(self) -> str:
        """Media path relative to the dataset directory."""
        return f"videos/{self.video_id}.mp4" if self.media == "video" else f"images/{self.video_id}.jpg"


def item_rng(seed: int, media: str, index: int, stream: int) -> np.random.Generator:
    """Generator for one item; ``stream`` separates layout (0), captions (1) and questions (2)."""
    return np.random.default_rng([seed, _MEDIA_CODE[media], index, stream])


def video_id(media: str, index: int) -> str:
    """``synth-000007`` for clips, ``synth-img-000007`` for stills."""
    return f"synth-{index:06d}" if media == "video" else f"synth-img-{index:06d}"


def assign_splits(n: int, val_fraction: float, test_fraction: float, seed: int, media: str) -> list[str]:
    """Exact-count random split of ``n`` items: round(fraction * n) each, at least 1 when n allows."""
    counts = []
    for fraction in (test_fraction, val_fraction):
        k = round(fraction * n)
        if fraction > 0 and k == 0 and n >= 3:
            k = 1
        counts.append(k)
    n_test, n_val = counts
    labels = ["test"] * n_test + ["val"] * n_val + ["train"] * max(0, n - n_test - n_val)
    order = np.random.default_rng([seed, _MEDIA_CODE[media], 2**31]).permutation(n)
    out = [""] * n
    for rank, i in enumerate(order):
        out[int(i)] = labels[rank]
    return out


def plan_item(cfg: SynthConfig, media: str, index: int, split: str = "train") -> ItemPlan:
    """Draw scene, objects, frame rate, length and trajectories of item ``index`` of ``media``."""
    rng = item_rng(cfg.seed, media, index, 0)
    scene = SCENES[rng.integers(len(SCENES))]
    if media == "video":
        fps = int(rng.integers(cfg.min_fps, cfg.max_fps + 1))
        duration = rng.uniform(cfg.min_duration_s, cfg.max_duration_s)
        num_frames = max(2, round(duration * fps))
    else:
        fps, num_frames = 0, 1
    k = int(rng.integers(cfg.min_objects, cfg.max_objects + 1))
    shapes = rng.choice(SHAPES, size=k, replace=False)
    allowed = [c for c in COLORS if c not in SCENE_EXCLUDED_COLORS[scene]]
    colors = rng.choice(allowed, size=k, replace=False)
    sizes = rng.choice(tuple(SIZES), size=k)
    directions = rng.choice(tuple(DIRECTIONS), size=k) if media == "video" else [""] * k
    entities = tuple(
        Entity(str(s), str(c), str(z), str(d)) for s, c, z, d in zip(shapes, colors, sizes, directions, strict=True)
    )
    starts, moves = _layout(rng, entities)
    crop = (int(rng.integers(cfg.size)), int(rng.integers(cfg.size)))
    return ItemPlan(video_id(media, index), media, index, split, scene, fps, num_frames, crop, entities, starts, moves)


Points = tuple[tuple[float, float], ...]


def _layout(rng: np.random.Generator, entities: tuple[Entity, ...], tries: int = 30) -> tuple[Points, Points]:
    """Trajectories of all entities, redrawn (up to ``tries`` times) while objects overlap along the way.

    Overlap is checked at five instants; the draw with the fewest overlaps wins, so objects in
    crowded clips may still cross (their boxes are recorded all the same).
    """
    best: tuple[int, Points, Points] | None = None
    for _ in range(tries):
        drawn = [_trajectory(rng, ent) for ent in entities]
        starts = tuple(start for start, _ in drawn)
        moves = tuple(move for _, move in drawn)
        clashes = 0
        for t in (0.0, 0.25, 0.5, 0.75, 1.0):
            centres = tuple((x + t * dx, y + t * dy) for (x, y), (dx, dy) in zip(starts, moves, strict=True))
            clashes += _overlapping_pairs(entities, centres)
        if best is None or clashes < best[0]:
            best = (clashes, starts, moves)
        if clashes == 0:
            break
    assert best is not None
    return best[1], best[2]


def _overlapping_pairs(entities: tuple[Entity, ...], centres: Points) -> int:
    """How many pairs of objects (as squares of their size) overlap when centred at ``centres``."""
    count = 0
    for i in range(len(entities)):
        for j in range(i + 1, len(entities)):
            reach = (SIZES[entities[i].size] + SIZES[entities[j].size]) / 2
            (xi, yi), (xj, yj) = centres[i], centres[j]
            count += abs(xi - xj) < reach and abs(yi - yj) < reach
    return count


def _trajectory(rng: np.random.Generator, ent: Entity) -> tuple[tuple[float, float], tuple[float, float]]:
    """Start centre and total displacement keeping the whole object inside the frame."""
    half = SIZES[ent.size] / 2
    room = 1 - 2 * half  # the centre may range over [half, 1 - half]
    ux, uy = DIRECTIONS[ent.direction] if ent.direction else (0.0, 0.0)
    distance = rng.uniform(0.3, 0.6)
    for u in (ux, uy):
        if abs(u) > 1e-9:
            distance = min(distance, 0.95 * room / abs(u))
    dx, dy = distance * ux, distance * uy
    x0 = rng.uniform(half + max(0.0, -dx), 1 - half - max(0.0, dx))
    y0 = rng.uniform(half + max(0.0, -dy), 1 - half - max(0.0, dy))
    return (float(x0), float(y0)), (float(dx), float(dy))


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
    out = sum(0.5**o * _value_noise(rng, n, cells * 2**o, cells * 2**o) for o in range(octaves))
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


# --------------------------------------------------------------------------- text


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _shape_word(rng: np.random.Generator, shape: str) -> str:
    """The canonical noun most of the time (so it dominates mined nouns), else a synonym."""
    synonyms = SHAPE_SYNONYMS[shape]
    return synonyms[0] if len(synonyms) == 1 or rng.random() < 0.7 else _pick(rng, synonyms[1:])


def _with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _noun_phrase(rng: np.random.Generator, ent: Entity, color_mention: float = 1.0) -> str:
    words = [_pick(rng, SIZE_PHRASES[ent.size])] if rng.random() < 0.5 else []
    if color_mention >= 1.0 or rng.random() < color_mention:  # no draw at 1.0: default worlds stay byte-identical
        words.append(ent.color)
    return _with_article(" ".join([*words, _shape_word(rng, ent.shape)]))


def _join(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


_VERBS = (("moves", "moving"), ("slides", "sliding"), ("drifts", "drifting"), ("glides", "gliding"))
_VERBS += (("travels", "travelling"), ("is moving", "moving"), ("is heading", "heading"), ("floats", "floating"))
_STILL_VERBS = (("sits", "rests", "lies", "is placed"), ("sit", "rest", "lie", "are placed", "appear"))  # (1, many)
_OPENERS = ("", "a video of ", "a clip showing ", "footage of ", "we see ", "you can see ")
_STILL_OPENERS = ("", "a picture of ", "a photo showing ", "an image of ", "we see ")


def _clauses(rng: np.random.Generator, plan: ItemPlan, participle: bool, color_mention: float) -> list[str]:
    """One clause per entity: '<noun phrase> <verb> <direction>' (stills: the noun phrase alone)."""
    out = []
    for ent in plan.entities:
        noun = _noun_phrase(rng, ent, color_mention)
        if not ent.direction:
            out.append(noun)
            continue
        finite, ing = _VERBS[int(rng.integers(len(_VERBS)))]
        out.append(f"{noun} {ing if participle else finite} {_pick(rng, DIRECTION_PHRASES[ent.direction])}")
    return out


def _caption(rng: np.random.Generator, plan: ItemPlan, color_mention: float = 1.0) -> str:
    """One caption of ``plan`` from a randomly chosen template."""
    scene = _pick(rng, SCENE_PHRASES[plan.scene])
    where = f"{_pick(rng, SCENE_PREPS[plan.scene])} {scene}"
    template = int(rng.integers(4))
    openers = _OPENERS if plan.media == "video" else _STILL_OPENERS
    if template == 0 and plan.media == "image":  # "a red circle and a blue star rest on the grass"
        verb = _pick(rng, _STILL_VERBS[len(plan.entities) > 1])
        text = f"{_join(_clauses(rng, plan, False, color_mention))} {verb} {where}"
    elif template == 0:  # "a red circle moves to the left over the grass"
        text = f"{_join(_clauses(rng, plan, False, color_mention))} {where}"
    elif template == 1:  # "a grassy field with a red circle moving to the left"
        text = f"{scene} with {_join(_clauses(rng, plan, True, color_mention))}"
    elif template == 2:  # "two shapes over the sand: a red circle moving left and ..."
        k = len(plan.entities)
        noun = _pick(rng, ("shape", "object")) + ("s" if k > 1 else "")
        count = "a single" if k == 1 else _COUNT_WORDS[k]
        text = f"{count} {noun} {where}: {_join(_clauses(rng, plan, True, color_mention))}"
    else:  # "a video of a red circle moving to the left across the grass"
        text = f"{_pick(rng, openers)}{_join(_clauses(rng, plan, True, color_mention))} {where}"
    return text[0].upper() + text[1:] + "."


def captions_for(plan: ItemPlan, n: int, rng: np.random.Generator, color_mention: float = 1.0) -> list[str]:
    """``n`` captions of ``plan``, distinct where the templates allow (up to 50 draws per caption).

    Each noun phrase names its object's colour with probability ``color_mention`` (1.0: always). Below
    1.0 some captions say only "a triangle", as real captions leave attributes out. docs/pem.md measures
    what it changes for the prompter (at CPU scale: nothing; the scene, not the captions, held it back).
    """
    seen: list[str] = []
    for _ in range(50 * n):
        text = _caption(rng, plan, color_mention)
        if text not in seen:
            seen.append(text)
        if len(seen) == n:
            return seen
    return seen + [seen[i % len(seen)] for i in range(n - len(seen))]  # repeats only if templates run out


_QUESTIONS: dict[str, tuple[str, ...]] = {
    "color": ("what colour is the {shape}?", "what color is the {shape}?", "which colour does the {shape} have?"),
    "shape": ("what shape is the {color} object?", "what is the {color} thing?", "which shape is {color}?"),
    "direction": (
        "which direction does the {ref} move?",
        "where is the {ref} heading?",
        "in which direction is the {ref} moving?",
        "which way does the {ref} go?",
    ),
    "count": ("how many objects are there?", "how many shapes can be seen?", "what is the number of shapes?"),
    "scene": ("what is the background?", "where are the shapes?", "what is behind the objects?", "what scene is this?"),
}


def questions_for(plan: ItemPlan, n: int, rng: np.random.Generator) -> list[tuple[str, str, str]]:
    """``n`` (question, answer, answer_type) triples cycling through the answer types in random order."""
    types = [t for t in manifest.ANSWER_TYPES if plan.media == "video" or t != "direction"]
    order: list[str] = []
    while len(order) < n:
        order += [types[int(i)] for i in rng.permutation(len(types))]
    out = []
    for kind in order[:n]:
        ent = plan.entities[int(rng.integers(len(plan.entities)))]
        shape = _shape_word(rng, ent.shape)
        ref = f"{ent.color} {shape}" if rng.random() < 0.5 else shape
        question = _pick(rng, _QUESTIONS[kind]).format(shape=shape, color=ent.color, ref=ref)
        answer = {
            "color": ent.color,
            "shape": ent.shape,
            "direction": ent.direction,
            "count": str(len(plan.entities)),
            "scene": plan.scene,
        }[kind]
        out.append((question[0].upper() + question[1:], answer, kind))
    return out


# --------------------------------------------------------------------------- writing one item


# x264's CPU flags (x264.h, X264_CPU_*) for the instruction sets up to AVX2, keyed by /proc/cpuinfo names.
_X264_CPU = {"sse": 0x6, "sse2": 0x8, "abm": 0x10, "pni": 0x20, "ssse3": 0x40, "sse4_1": 0x80, "sse4_2": 0x100,
             "avx": 0x200, "fma": 0x1000, "bmi1": 0x2000, "bmi2": 0x4000, "avx2": 0x8000}  # fmt: skip
_X264_CPU_MMX = 0x1


@functools.cache
def x264_asm() -> str:
    """The ``asm`` value for x264: this CPU's SIMD up to AVX2, never AVX-512 (``"0"``, plain C, off x86 Linux).

    On an AVX-512 CPU x264 picks AVX-512 kernels by itself, and with them its output is not a function of
    its input: one 32 px clip encoded 60 times in one process gave three to four different files (which
    one depended on the process's earlier allocations; two of them decoded to frames up to 12/255 apart).
    Capped at AVX2 the same loop gave one file 60 times, as did plain C. x264's SIMD output is not
    bit-exact with its C code (the mbtree maths differs), so the bytes are the same from run to run and
    process to process on one machine, and across machines with the same instruction sets up to AVX2.
    """
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            line = next((row for row in fh if row.startswith("flags")), "")
    except OSError:
        line = ""
    flags = set(line.partition(":")[2].split())
    if "mmx" not in flags:  # not x86, or no /proc: x264's C code
        return "0"
    return str(_X264_CPU_MMX | sum(bit for name, bit in _X264_CPU.items() if name in flags))


def encode_mp4(frames: np.ndarray, fps: int, path: str, crf: int = 23) -> None:
    """Encode uint8 (T, H, W, 3) RGB frames as h264 mp4 whose bytes depend on the frames only.

    x264 runs single-threaded and without its AVX-512 code (:func:`x264_asm`).
    """
    import av

    with av.open(path, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {
            "crf": str(crf), "preset": "fast", "threads": "1", "g": str(fps), "x264-params": f"asm={x264_asm()}",
        }  # fmt: skip
        for i, img in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _save_jpeg(img: np.ndarray, path: str, quality: int) -> None:
    from PIL import Image

    Image.fromarray(img).save(path, format="JPEG", quality=quality)


@dataclass
class ItemResult:
    """What a worker hands back for one item: its plan, its media file and its text."""

    plan: ItemPlan
    local_path: str
    captions: list[str]
    qa: list[tuple[str, str, str]]
    boxes: np.ndarray  # (T, K, 4) float32


@dataclass(frozen=True)
class _Task:
    cfg: SynthConfig
    media: str
    index: int
    split: str
    tmp_dir: str = field(repr=False)


def _build_item(task: _Task) -> ItemResult:
    """Plan, render, encode and describe one item (runs in a worker process)."""
    cfg = task.cfg
    plan = plan_item(cfg, task.media, task.index, task.split)
    frames, boxes = render(plan, cfg.size, cfg.seed)
    local_path = os.path.join(task.tmp_dir, plan.rel_path)
    os.makedirs(os.path.dirname(local_path), exist_ok=True)
    if plan.media == "video":
        encode_mp4(frames, plan.fps, local_path, cfg.crf)
    else:
        _save_jpeg(frames[0], local_path, cfg.jpeg_quality)
    rng = item_rng(cfg.seed, plan.media, plan.index, 1)
    captions = captions_for(plan, cfg.captions_per_video, rng, cfg.color_mention)
    qa = questions_for(plan, cfg.qa_per_video, item_rng(cfg.seed, plan.media, plan.index, 2))
    return ItemResult(plan, local_path, captions, qa, boxes)


# --------------------------------------------------------------------------- the dataset


def _tasks(cfg: SynthConfig, tmp_dir: str) -> list[_Task]:
    tasks = []
    for media, n in (("video", cfg.num_videos), ("image", cfg.resolved_num_images())):
        splits = assign_splits(n, cfg.val_fraction, cfg.test_fraction, cfg.seed, media)
        tasks += [_Task(cfg, media, i, splits[i], tmp_dir) for i in range(n)]
    return tasks


def _run(tasks: list[_Task], workers: int) -> Iterator[ItemResult]:
    """Results in task order, from a pool of spawned processes (or in-process when workers == 1)."""
    if workers == 1 or len(tasks) <= 1:
        yield from map(_build_item, tasks)
        return
    chunk = max(1, min(8, len(tasks) // (4 * workers)))
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (boto3)
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        yield from pool.map(_build_item, tasks, chunksize=chunk)


class _Tables:
    """Row accumulators for the four manifests, filled in item order."""

    def __init__(self) -> None:
        self.videos: list[dict] = []
        self.captions: list[dict] = []
        self.qa: list[dict] = []
        self.boxes: dict[str, list] = {name: [] for name in manifest.BOX_SCHEMA.names}

    def add(self, item: ItemResult) -> None:
        p = item.plan
        vid, split = p.video_id, p.split
        self.videos.append({"video_id": vid, "path": p.rel_path, "split": split, "media": p.media, "source": "synth"})
        self.captions += [
            {"video_id": vid, "caption_id": f"{vid}-c{j}", "caption": text, "split": split}
            for j, text in enumerate(item.captions)
        ]
        self.qa += [
            {"video_id": vid, "qa_id": f"{vid}-q{j}", "question": q, "answer": a, "answer_type": kind, "split": split}
            for j, (q, a, kind) in enumerate(item.qa)
        ]
        t, k = item.boxes.shape[:2]  # rows are frame-major: (frame 0, entity 0), (frame 0, entity 1), ...
        columns = {
            "video_id": [vid] * (t * k),
            "frame_index": np.repeat(np.arange(t), k).tolist(),
            "entity_id": list(range(k)) * t,
            "name": [e.name for e in p.entities] * t,
            "shape": [e.shape for e in p.entities] * t,
            "color": [e.color for e in p.entities] * t,
            "size": [e.size for e in p.entities] * t,
        }
        flat = item.boxes.reshape(t * k, 4)
        columns |= {col: flat[:, i].tolist() for i, col in enumerate(("x0", "y0", "x1", "y1"))}
        for col, values in columns.items():
            self.boxes[col] += values

    def write(self, out: str) -> None:
        """Write the manifests; videos.parquet last, so its presence means the dataset is complete."""
        manifest.write(out, manifest.CAPTIONS, manifest.from_rows(self.captions, CAPTION), CAPTION)
        manifest.write(out, manifest.QA, manifest.from_rows(self.qa, manifest.QA_SCHEMA), manifest.QA_SCHEMA)
        manifest.write(out, manifest.BOXES, pa.table(self.boxes, schema=BOX), BOX)
        manifest.write(out, manifest.VIDEOS, manifest.from_rows(self.videos, RAW_VIDEO), RAW_VIDEO)


def generate(out: str, cfg: SynthConfig) -> dict:
    """Write the synthetic world to ``out`` (local directory or ``s3://`` prefix).

    Media are rendered into a local temporary directory by ``cfg.workers`` processes and copied
    to ``out`` with :func:`vlp.storage.upload`; the manifests are written last, so a dataset
    directory with a ``videos.parquet`` is complete. Workers are *spawned* processes, so a plain
    script that calls this with ``workers > 1`` needs the usual ``if __name__ == "__main__":`` guard.

    Args:
        out: dataset directory or ``s3://bucket/prefix``.
        cfg: the synth section of the config.

    Returns:
        Counts: ``{"videos", "images", "captions", "qa", "boxes", "splits": {"train", "val", "test"}}``;
        ``splits`` counts clips and stills together.

    Raises:
        ValueError: a config value is out of range (the message names the key).
    """
    cfg.validate()
    tables = _Tables()
    with tempfile.TemporaryDirectory(prefix="vlp-synth-") as tmp_dir:
        tasks = _tasks(cfg, tmp_dir)
        bar = tqdm(total=len(tasks), desc="synth", unit="item", file=sys.stderr, disable=not sys.stderr.isatty())
        with bar:
            for item in _run(tasks, cfg.workers):
                storage.upload(item.local_path, storage.join(out, item.plan.rel_path))
                os.remove(item.local_path)
                tables.add(item)
                bar.update()
    tables.write(out)
    splits = {s: sum(row["split"] == s for row in tables.videos) for s in manifest.SPLITS}
    return {
        "videos": cfg.num_videos,
        "images": cfg.resolved_num_images(),
        "captions": len(tables.captions),
        "qa": len(tables.qa),
        "boxes": len(tables.boxes["video_id"]),
        "splits": splits,
    }
