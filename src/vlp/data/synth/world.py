"""What the synthetic world is made of: its vocabulary (shapes, colours, sizes, directions, scenes and the words
captions use for them) and :class:`SynthConfig`, its size and look."""

from __future__ import annotations

from dataclasses import dataclass

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
