"""Probing real mp4 files, and reading their frames through the decoder chains extract-frames uses."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

from vlp.data.frames import decode_frames
from vlp.data.video import BACKENDS, VideoError, probe, read_image, short_reason


def grey_levels(frames: np.ndarray) -> list[int]:
    """The fixture video's frame i is uniformly grey (i*10)%250; recover i's grey level per frame."""
    return [round(float(f.mean())) for f in frames]


def test_probe_real_mp4(mp4_factory):
    info = probe(str(mp4_factory(num_frames=30, fps=15, size=(64, 48))))
    assert (info.num_frames, info.width, info.height) == (30, 64, 48)
    assert info.fps == pytest.approx(15.0)
    assert info.duration_s == pytest.approx(2.0)
    assert info.backend == "decord"


def tried(message: str) -> list[str]:
    """The readers a ``VideoError`` of :func:`read_with_fallbacks` names, in order ("<name>: <reason>; ...")."""
    return re.findall(r"(?:^|; )(sparse|decord|pyav): ", message)


DECODERS = ["sparse", "decord", "pyav"]  # frames.decode_frames' chains: what extract-frames decodes with


@pytest.mark.parametrize("decoder", DECODERS)
def test_every_decoder_returns_exactly_the_requested_frames(mp4_factory, decoder):
    path = str(mp4_factory(num_frames=24))
    frames = decode_frames(path, [0, 7, 13, 23], decoder)
    assert frames.shape == (4, 48, 64, 3) and frames.dtype == np.uint8
    levels = grey_levels(frames)
    for got, i in zip(levels, [0, 7, 13, 23], strict=True):
        assert abs(got - (i * 10) % 250) <= 3, (decoder, levels)


@pytest.mark.parametrize("reader", sorted(BACKENDS))
def test_each_fallback_reader_keeps_request_order_and_duplicates(mp4_factory, reader):
    path = str(mp4_factory(num_frames=12))
    levels = grey_levels(BACKENDS[reader](path, [9, 2, 2]))
    assert [round(v / 10) for v in levels] == [9, 2, 2], reader


def test_an_out_of_range_index_names_every_reader_tried(mp4_factory):
    path = str(mp4_factory(num_frames=10))
    with pytest.raises(VideoError) as info:
        decode_frames(path, [3, 10])
    assert tried(str(info.value)) == ["sparse", "decord", "pyav"]
    assert "; decord: frame indices [10] out of range for 10 frames; pyav: " in str(info.value)


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
    pixels = read_image(str(path))
    assert pixels.shape == (20, 30, 3) and abs(float(pixels.mean()) - 128) <= 2


def test_a_file_no_decoder_decodes_names_every_decoder_tried(tmp_path):
    path = tmp_path / "noise.mp4"
    path.write_bytes(bytes(range(256)) * 16)
    chains = {"sparse": ["sparse", "decord", "pyav"], "decord": ["decord", "pyav"], "pyav": ["pyav"]}
    for decoder, chain in chains.items():
        with pytest.raises(VideoError) as info:
            decode_frames(str(path), [0], decoder)
        assert tried(str(info.value)) == chain, str(info.value)


def test_short_reason_is_one_bounded_line():
    assert short_reason(RuntimeError("a\n  b\tc")) == "a b c"
    assert short_reason(KeyError()) == "KeyError"
    long = short_reason(ValueError("x" * 500), limit=50)
    assert len(long) == 50 and long.endswith("...")
