"""TS2-Net numerical parity: an imported released-layout checkpoint against the reference code's logits.

Imports ``tests/fixtures/ts2net_parity/ts2net_tiny.pth`` with ``vlp import-checkpoint``'s code and prints the
largest difference of vlp's text-video logits from the reference's (``io.pt``), with the top-k noise seeded as the
reference drew it and with sigma -> 0, and of vlp's default inference (hard top-k) from the sigma -> 0 reference.

    python benchmarks/parity/ts2net_parity.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

from vlp.models.ts2net import importer as import_ts2net
from vlp.models.ts2net.model import FAMILY, TS2Net

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

FIXTURE = common.FIXTURES / "ts2net_parity"


def logits(model: TS2Net, io: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        torch.manual_seed(7)  # the reference drew its top-k noise from the global generator seeded 7
        videos = FAMILY.encode_video(model, io["video"].float())
        texts = FAMILY.encode_text(model, io["input_ids"], io["attention_mask"])
        return model.clip.logit_scale.exp() * FAMILY.similarity(model, texts, videos)


def main() -> None:
    state, _ = import_ts2net.read_checkpoint(str(FIXTURE / "ts2net_tiny.pth"))
    io = torch.load(FIXTURE / "io.pt", weights_only=True)
    cfg, weights, report = import_ts2net.build(state, num_frames=io["video"].shape[1])
    print(f"imported: {len(report.mapped)} tensors mapped, {len(report.unmapped)} source keys explained as unused")
    for name, rule, sigma, ref in (
        ("seeded draws (sigma 0.05, 500 draws)", "noise", 0.05, "logits_seeded"),
        ("sigma 1e-8 (the hard top-k)", "noise", 1e-8, "logits_hard"),
        ("vlp default: hard top-k at inference", "hard", cfg.select_sigma, "logits_hard"),
    ):
        model = TS2Net(replace(cfg, select_eval=rule, select_sigma=sigma))
        model.load_state_dict(weights)
        diff = (logits(model.eval(), io) - io[ref]).abs().max().item()
        print(f"{name:40s} max |vlp - reference| = {diff:.2e}  (logits of scale {io[ref].abs().max():.2f})")


if __name__ == "__main__":
    main()
