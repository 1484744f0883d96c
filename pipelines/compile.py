"""Compile the pipelines to KFP IR YAML: ``python -m pipelines.compile [--config FILE] [--out-dir DIR]``.

``pipelines/compiled/*.yaml`` is committed (uploadable in the KFP UI); tests fail when it drifts from the code.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kfp import compiler

from pipelines import config as pipeline_config
from pipelines import index, pretrain, reevaluate, retrieval

COMPILED_DIR = Path(__file__).resolve().parent / "compiled"


def builders() -> dict[str, Callable[[pipeline_config.PipelineConfig], Any]]:
    """Every compiled pipeline by file name: a pre-training DAG per family that pre-trains (``pretrain`` is the
    default family's, ``pretrain-<family>`` another's), re-evaluation, retrieval and index."""
    found: dict[str, Callable[[pipeline_config.PipelineConfig], Any]] = {
        pretrain.name_of(family).removeprefix("vlp-"): functools.partial(pretrain.build, family=family)
        for family in pretrain.families()
    }
    return found | {"reevaluate": reevaluate.build, "retrieval": retrieval.build, "index": index.build}


def compile_all(
    config_path: str | Path = pipeline_config.CONFIG_DIR / "default.yaml", out_dir: str | Path = COMPILED_DIR
) -> list[Path]:
    """Compile every pipeline with the config at ``config_path`` into ``out_dir/<name>.yaml``."""
    cfg = pipeline_config.load(config_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, build in builders().items():
        path = out_dir / f"{name}.yaml"
        compiler.Compiler().compile(build(cfg), str(path))
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.compile", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(pipeline_config.CONFIG_DIR / "default.yaml"), help="pipeline config")
    parser.add_argument("--out-dir", default=str(COMPILED_DIR), help="where the YAML files go")
    args = parser.parse_args(argv)
    for path in compile_all(args.config, args.out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
