"""Reusable model layers: the TimeSformer video encoder."""

from vlp.models.layers.timesformer import (
    DividedSTBlock,
    TimeSformer,
    TimeSformerConfig,
    VideoEncoderOutput,
    load_vit_weights,
)

__all__ = ["DividedSTBlock", "TimeSformer", "TimeSformerConfig", "VideoEncoderOutput", "load_vit_weights"]
