"""ALPRO objectives, one pure function per loss; each takes model outputs, none calls a model."""

from vlp.losses.contrastive import clamp_temperature, vtc_logits, vtc_loss
from vlp.losses.entity import (
    Box,
    PemBoxes,
    crop_frames,
    pem_keep_mask,
    pem_loss,
    pool_box_tokens,
    pseudo_labels,
    sample_pem_box,
    sample_pem_boxes,
)
from vlp.losses.matching import sample_hard_negatives, vtm_labels, vtm_loss, vtm_pair_indices
from vlp.losses.mlm import IGNORE_INDEX, mask_tokens, mlm_loss

__all__ = [
    "IGNORE_INDEX",
    "Box",
    "PemBoxes",
    "clamp_temperature",
    "crop_frames",
    "mask_tokens",
    "mlm_loss",
    "pem_keep_mask",
    "pem_loss",
    "pool_box_tokens",
    "pseudo_labels",
    "sample_hard_negatives",
    "sample_pem_box",
    "sample_pem_boxes",
    "vtc_logits",
    "vtc_loss",
    "vtm_labels",
    "vtm_loss",
    "vtm_pair_indices",
]
