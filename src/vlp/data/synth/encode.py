"""Encoding: media files whose bytes depend on their pixels only (h264 clips, JPEG stills)."""

from __future__ import annotations

import functools

import numpy as np

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
