"""ALPRO's PEM figure (its Fig. 3): a clip's frames with the crop the prompter saw and the prompter's top entities,
drawn with PIL into a local PNG file (``vlp.models.alpro.pretraining.pem_examples`` uploads it)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType: fixed-size bitmap font
        return ImageFont.load_default()


def _as_images(frames: Sequence[Image.Image] | np.ndarray) -> list[Image.Image]:
    if isinstance(frames, np.ndarray):
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(f"frames array must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
        return [Image.fromarray(f) for f in frames]
    images = [f.convert("RGB") for f in frames]
    if not images or len({im.size for im in images}) != 1:
        raise ValueError("pem_figure needs at least one frame, all of the same size")
    return images


def pem_figure(
    frames: Sequence[Image.Image] | np.ndarray,
    box: tuple[float, float, float, float],
    top5: Sequence[tuple[str, float]],
    path: str | Path,
    height: int = 128,
) -> str:
    """Draw a PEM example like ALPRO Fig. 3: frames side by side with the crop box, and the prompter's top-5.

    Args:
        frames: the clip's frames, PIL images or a uint8 ``(T, H, W, 3)`` array, all the same size.
        box: the crop ``(x0, y0, x1, y1)`` in pixels of the frames (drawn on every frame).
        top5: ``[(entity, probability)]``, best first; drawn as labelled bars (probabilities in [0, 1]).
        path: local PNG path (parent directories are created).
        height: frame height in the figure; frames keep their aspect ratio.

    Returns:
        ``str(path)``.
    """
    images = _as_images(frames)
    if not images:
        raise ValueError("pem_figure needs at least one frame")
    w, h = images[0].size
    x0, y0, x1, y1 = box
    if not (0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h):
        raise ValueError(f"box {box} must satisfy 0 <= x0 < x1 <= {w} and 0 <= y0 < y1 <= {h} (frame pixels)")
    if not top5:
        raise ValueError("top5 must hold at least one (entity, probability) pair")
    scale = height / h
    fw, gap, line = max(1, round(w * scale)), 4, 22
    font = _font(14)
    bar_x = gap + 12 + int(max(font.getlength(str(e)) for e, _ in top5))  # bars start right of the longest name
    width = max(len(images) * (fw + gap) + gap, bar_x + 260 + 70)
    canvas = Image.new("RGB", (width, height + 2 * gap + 24 + line * len(top5)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, frame in enumerate(images):
        left = gap + i * (fw + gap)
        canvas.paste(frame.resize((fw, height)), (left, gap))
        rect = (left + x0 * scale, gap + y0 * scale, left + x1 * scale - 1, gap + y1 * scale - 1)
        draw.rectangle(rect, outline="#ff2020", width=2)
    top = height + 2 * gap
    draw.text((gap, top), f"prompter top-{len(top5)} entities for the crop", fill="black", font=font)
    for j, (entity, prob) in enumerate(top5):
        y = top + 24 + j * line
        draw.text((gap, y), str(entity), fill="black", font=font)
        bar = int(260 * min(max(float(prob), 0.0), 1.0))
        draw.rectangle((bar_x, y + 2, bar_x + max(bar, 1), y + line - 6), fill="#4a78c2")
        draw.text((bar_x + bar + 10, y), f"{float(prob):.3f}", fill="black", font=font)
    out = Path(path)
    if "://" in str(path):
        raise ValueError(f"pem_figure writes a local file, got {path!r}; upload it with vlp.storage afterwards")
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out, format="PNG")
    return str(out)
