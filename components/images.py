"""The container images of the components, read from ``docker/image.env`` (the one place they are named)."""

from __future__ import annotations

import re
from pathlib import Path

IMAGE_ENV = Path(__file__).resolve().parents[1] / "docker" / "image.env"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def read_image_env(path: Path = IMAGE_ENV) -> dict[str, str]:
    """``KEY=VALUE`` lines of ``path`` (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{path}:{number}: expected KEY=VALUE, got {line!r}")
        values[key.strip()] = value.strip()
    return values


def image(gpu: bool = False, path: Path = IMAGE_ENV) -> str:
    """``{REGISTRY}/{IMAGE_NAME}:{IMAGE_TAG}`` (``-cuda`` appended to the tag for GPU steps), or
    ``{REGISTRY}/{IMAGE_NAME}@{digest}`` when ``IMAGE_DIGEST`` (GPU steps: ``IMAGE_DIGEST_CUDA``) is set: a digest
    names one pushed image for good, where a tag can be moved."""
    env = read_image_env(path)
    missing = [k for k in ("REGISTRY", "IMAGE_NAME", "IMAGE_TAG") if not env.get(k)]
    if missing:
        raise ValueError(f"{path}: {', '.join(missing)} missing; it must name REGISTRY, IMAGE_NAME and IMAGE_TAG")
    repo = f"{env['REGISTRY']}/{env['IMAGE_NAME']}"
    key = "IMAGE_DIGEST_CUDA" if gpu else "IMAGE_DIGEST"
    digest = env.get(key, "")
    if digest:
        if not DIGEST.match(digest):
            raise ValueError(
                f"{path}: {key}={digest!r} is not a digest; expected sha256: and 64 lowercase hex digits, as "
                "`docker buildx imagetools inspect <image>` prints it (or empty to run the tag)"
            )
        return f"{repo}@{digest}"
    return f"{repo}:{env['IMAGE_TAG']}" + ("-cuda" if gpu else "")


CPU_IMAGE = image()
GPU_IMAGE = image(gpu=True)
