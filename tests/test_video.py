"""Probing and sparse reading of real mp4 files through decord, and the PyAV fallback."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vlp.data.video import VideoError, probe, read_frames, short_reason


def grey_levels(frames: np.ndarray) -> list[int]:
    """The fixture video's frame i is uniformly grey (i*10)%250; recover i's grey level per frame."""
    return [round(float(f.mean())) for f in frames]


def test_probe_real_mp4(mp4_factory):
    info = probe(str(mp4_factory(num_frames=30, fps=15, size=(64, 48))))
    assert (info.num_frames, info.width, info.height) == (30, 64, 48)
    assert info.fps == pytest.approx(15.0)
    assert info.duration_s == pytest.approx(2.0)
    assert info.backend == "decord"


@pytest.mark.parametrize("backend", ["decord", "pyav", "auto"])
def test_read_frames_returns_exactly_the_requested_frames(mp4_factory, backend):
    path = str(mp4_factory(num_frames=24))
    frames = read_frames(path, [0, 7, 13, 23], backend=backend)
    assert frames.shape == (4, 48, 64, 3) and frames.dtype == np.uint8
    levels = grey_levels(frames)
    for got, i in zip(levels, [0, 7, 13, 23], strict=True):
        assert abs(got - (i * 10) % 250) <= 3, (backend, levels)


def test_read_frames_keeps_request_order_and_duplicates(mp4_factory):
    path = str(mp4_factory(num_frames=12))
    for backend in ("decord", "pyav"):
        levels = grey_levels(read_frames(path, [9, 2, 2], backend=backend))
        assert [round(v / 10) for v in levels] == [9, 2, 2], backend


def test_out_of_range_index_is_an_error(mp4_factory):
    path = str(mp4_factory(num_frames=10))
    with pytest.raises(VideoError, match=r"^decord: frame indices \[10\] out of range for 10 frames; pyav: "):
        read_frames(path, [3, 10])


def test_bad_files_give_one_line_reasons(tmp_path, mp4_factory):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    text = tmp_path / "notes.mp4"
    text.write_text("this is not a video\n")
    good = mp4_factory(num_frames=40)
    truncated = tmp_path / "cut.mp4"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    cases = {
        str(tmp_path / "missing.mp4"): "missing file",
        str(empty): "empty file",
        str(text): "not decodable",
        str(truncated): "not decodable",
    }
    for path, reason in cases.items():
        with pytest.raises(VideoError) as info:
            probe(path)
        assert reason in str(info.value)
        assert "\n" not in str(info.value)


def test_still_image_is_one_frame(tmp_path):
    path = tmp_path / "img.jpg"
    Image.fromarray(np.full((20, 30, 3), 128, np.uint8)).save(path)
    info = probe(str(path))
    assert (info.num_frames, info.width, info.height, info.backend) == (1, 30, 20, "pil")
    assert read_frames(str(path), [0, 0]).shape == (2, 20, 30, 3)


def test_a_file_no_backend_decodes_names_every_backend_tried(tmp_path):
    path = tmp_path / "noise.mp4"
    path.write_bytes(bytes(range(256)) * 16)
    with pytest.raises(VideoError) as info:
        read_frames(str(path), [0])
    assert str(info.value).startswith("decord: ") and "; pyav: " in str(info.value)
    with pytest.raises(VideoError, match=r"^pyav: "):
        read_frames(str(path), [0], backend="pyav")
    with pytest.raises(ValueError, match="unknown video backend 'opencv'"):
        read_frames(str(path), [0], backend="opencv")


def test_short_reason_is_one_bounded_line():
    assert short_reason(RuntimeError("a\n  b\tc")) == "a b c"
    assert short_reason(KeyError()) == "KeyError"
    long = short_reason(ValueError("x" * 500), limit=50)
    assert len(long) == 50 and long.endswith("...")
