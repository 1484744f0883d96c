"""Planning: everything random about one clip or still (scene, objects, frame rate, length, trajectories) and the
splits, drawn before any pixel is rendered."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlp.data.synth.world import (
    _MEDIA_CODE,
    COLORS,
    DIRECTIONS,
    SCENE_EXCLUDED_COLORS,
    SCENES,
    SHAPES,
    SIZES,
    SynthConfig,
)

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
