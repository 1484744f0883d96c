"""Print how far vlp's ALBEF is from the reference code on the parity fixture: max |vlp - reference| per output.

    python benchmarks/parity/albef_parity.py

Imports each fixture checkpoint (``tests/fixtures/albef_parity/``: a salesforce/ALBEF pre-training file and a
LAVIS ``AlbefRetrieval`` file, tiny random-init weights, outputs computed by the reference classes; provenance
in its README) with ``vlp import-checkpoint``'s code, runs the same inputs through vlp, and prints one row per
output: ITC similarities (online and momentum, over batch + queue), the distilled ITC targets at alpha = 0.4,
ITM logits of every pair and MLM logits. ``tests/test_import_albef.py`` asserts the same differences stay
below 1e-4.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from vlp.config import load_config
from vlp.losses import distill
from vlp.models import directory
from vlp.models.albef.model import albef_forward, itm_logits
from vlp.models.family import PretrainBatch, StepContext
from vlp.steps.import_checkpoint import import_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

FIXTURE = common.FIXTURES / "albef_parity"
ALPHA = 0.4  # the fixture's distillation weight
CASES = [  # (checkpoint, format, reference outputs)
    ("albef_pretrain.pt", "albef", "outputs_albef.pt"),
    ("lavis_retrieval.pt", "lavis", "outputs_lavis.pt"),
]


@torch.no_grad()
def albef_outputs(model: torch.nn.Module, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """vlp's numbers for the fixture's outputs (an image is a one-frame clip)."""
    video, ids, mask = x["image"].unsqueeze(1), x["input_ids"], x["attention_mask"]
    b = ids.shape[0]
    full_cfg = model.cfg
    model.cfg = replace(full_cfg, losses=("itc",))  # the ITC part of the forward (ITM / MLM draw at random)
    try:
        batch = PretrainBatch(video=video, input_ids=ids, attention_mask=mask, video_index=x["image_id"])
        itc = albef_forward(model, batch, StepContext())
    finally:
        model.cfg = full_cfg
    image_feat, visual = model.online.encode_video(video)
    text_feat, text = model.online.encode_text(ids, mask)
    t_idx, v_idx = torch.arange(b).repeat_interleave(b), torch.arange(b).repeat(b)  # pair (i, j) = text i, image j
    out = {
        "image_embeds": visual.frame_tokens[:, 0],
        "text_embeds": text.tokens,
        "image_feat": image_feat,
        "text_feat": text_feat,
        "temp": model.temperature().detach(),
        "sim_i2t": itc.itc_i2t,
        "sim_t2i": itc.itc_t2i,
        "sim_i2t_m": itc.itc_i2t_m,
        "sim_t2i_m": itc.itc_t2i_m,
        "sim_i2t_targets": distill.itc_targets(itc.itc_i2t_m, itc.itc_positives, ALPHA),
        "sim_t2i_targets": distill.itc_targets(itc.itc_t2i_m, itc.itc_positives, ALPHA),
        "itm_logits": itm_logits(model, text.tokens[t_idx], mask[t_idx], visual.tokens[v_idx]).view(b, b, 2),
    }
    if model.online.mlm_head is not None:
        masked = model.online.text(x["mlm_input_ids"], mask)
        out["mlm_logits"] = model.online.mlm_head(model.fuse(masked.tokens, mask, visual.tokens).text)
        _, visual_m = model.momentum.encode_video(video)
        masked_m = model.momentum.text(x["mlm_input_ids"], mask)
        fused_m = model.momentum.fusion(masked_m.tokens, mask, visual_m.tokens)
        out["mlm_logits_m"] = model.momentum.mlm_head(fused_m.text)
    return out


def main() -> None:
    x = torch.load(FIXTURE / "inputs.pt", weights_only=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tok = common.parity_tokenizer(Path(tmp) / "tok")
        for name, fmt, ref in CASES:
            out = str(Path(tmp) / name)
            import_checkpoint(str(FIXTURE / name), out, load_config(None), tokenizer=tok, video_heads=2,
                              text_heads=2)  # fmt: skip
            model, _, _ = directory.load(out)
            reference = torch.load(FIXTURE / ref, weights_only=True)
            got = albef_outputs(model, x)
            for key, diff in common.max_diffs(got, reference).items():
                rows.append((f"{name} ({fmt})", key, diff, float(reference[key].abs().max())))
    print(f"{'checkpoint':<28} {'output':<16} {'max |vlp - ref|':>16} {'max |ref|':>10}")
    for name, key, diff, scale in rows:
        print(f"{name:<28} {key:<16} {diff:>16.2e} {scale:>10.3f}")
    print(f"largest difference: {max(r[2] for r in rows):.2e} (test tolerance 1e-4)")


if __name__ == "__main__":
    main()
