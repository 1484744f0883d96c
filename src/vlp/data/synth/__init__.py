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

Where the code lives: :mod:`~vlp.data.synth.world` (the vocabulary and :class:`SynthConfig`),
:mod:`~vlp.data.synth.plan` (what is random about an item: :func:`plan_item`, :func:`assign_splits`),
:mod:`~vlp.data.synth.render` (textures, shapes, :func:`render`), :mod:`~vlp.data.synth.language`
(:func:`captions_for`, :func:`questions_for`), :mod:`~vlp.data.synth.encode` (:func:`encode_mp4`,
:func:`x264_asm`) and :mod:`~vlp.data.synth.dataset` (:func:`generate`: the worker processes and the manifests).
Everything named here is importable from :mod:`vlp.data.synth` itself.
"""

from vlp.data.synth.dataset import ItemResult, generate
from vlp.data.synth.encode import encode_mp4, x264_asm
from vlp.data.synth.language import captions_for, questions_for
from vlp.data.synth.plan import Entity, ItemPlan, Points, assign_splits, item_rng, plan_item, video_id
from vlp.data.synth.render import render, scene_texture, shape_mask
from vlp.data.synth.world import (
    COLORS,
    DIRECTION_PHRASES,
    DIRECTIONS,
    SCENE_EXCLUDED_COLORS,
    SCENE_PHRASES,
    SCENE_PREPS,
    SCENES,
    SHAPE_SYNONYMS,
    SHAPES,
    SIZE_PHRASES,
    SIZES,
    SynthConfig,
)

__all__ = [
    "COLORS",
    "DIRECTIONS",
    "DIRECTION_PHRASES",
    "SCENES",
    "SCENE_EXCLUDED_COLORS",
    "SCENE_PHRASES",
    "SCENE_PREPS",
    "SHAPES",
    "SHAPE_SYNONYMS",
    "SIZES",
    "SIZE_PHRASES",
    "Entity",
    "ItemPlan",
    "ItemResult",
    "Points",
    "SynthConfig",
    "assign_splits",
    "captions_for",
    "encode_mp4",
    "generate",
    "item_rng",
    "plan_item",
    "questions_for",
    "render",
    "scene_texture",
    "shape_mask",
    "video_id",
    "x264_asm",
]
