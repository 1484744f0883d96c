"""Print how far vlp's ALPRO is from the reference code on the parity fixture: max |vlp - reference| per output.

    python benchmarks/parity/alpro_parity.py

Imports each fixture checkpoint (``tests/fixtures/alpro_parity/``: salesforce/ALPRO and LAVIS formats, tiny
random-init weights, outputs computed by the reference classes; provenance in its README) with
``vlp import-checkpoint``'s code, runs the same inputs through vlp, and prints one row per output. The test
``tests/test_import_checkpoint.py`` asserts the same differences stay below 1e-4.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from vlp.config import load_config
from vlp.models import directory
from vlp.models.alpro.model import vtm_logits
from vlp.steps.import_checkpoint import import_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
import common

FIXTURE = common.FIXTURES / "alpro_parity"


@torch.no_grad()
def retrieval_outputs(model: torch.nn.Module, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """vlp's numbers for the fixture's retrieval outputs (the names of the reference's)."""
    video_feat, video_out = model.dual.encode_video(x["video"])
    text_feat, text_out = model.dual.encode_text(x["input_ids"], x["attention_mask"])
    temp = model.dual.temperature()
    b = x["video"].shape[0]
    t_idx, v_idx = torch.arange(b).repeat_interleave(b), torch.arange(b).repeat(b)  # pair (i, j) = text i, video j
    vtm = vtm_logits(model, text_out.tokens[t_idx], x["attention_mask"][t_idx], video_out.tokens[v_idx])
    out = {
        "video_embeds": video_out.tokens,
        "text_embeds": text_out.tokens,
        "video_feat": video_feat,
        "text_feat": text_feat,
        "sim_v2t": video_feat @ text_feat.t() / temp,
        "sim_t2v": text_feat @ video_feat.t() / temp,
        "vtm_logits": vtm.view(b, b, 2),
        "temp": temp,
    }
    if model.mlm_head is not None:
        masked = model.dual.text(x["mlm_input_ids"], x["attention_mask"])
        fused = model.fuse(masked.tokens, x["attention_mask"], video_out.tokens)
        out["mlm_logits"] = model.mlm_head(fused.text)
    return out


def main() -> None:
    x = torch.load(FIXTURE / "inputs.pt", weights_only=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tok = common.parity_tokenizer(Path(tmp) / "tok")
        answers = Path(tmp) / "answers.json"
        answers.write_text(json.dumps(["a", "b", "c", "d", "e"]))
        for name, ref in (("alpro_pretrain.pt", "outputs_alpro.pt"), ("lavis_retrieval.pt", "outputs_lavis.pt"),
                          ("alpro_qa.pt", "outputs_alpro.pt"), ("lavis_qa.pt", "outputs_lavis.pt")):  # fmt: skip
            out = str(Path(tmp) / name)
            qa = "qa" in name
            import_checkpoint(str(FIXTURE / name), out, load_config(None), tokenizer=tok, video_heads=2,
                              text_heads=2, answers=str(answers) if qa else "")  # fmt: skip
            model, _, _ = directory.load(out)
            reference = torch.load(FIXTURE / ref, weights_only=True)
            with torch.no_grad():
                got = (
                    {"qa_logits": model(x["video"], x["input_ids"], x["attention_mask"])}
                    if qa
                    else retrieval_outputs(model, x)
                )
            for key, diff in common.max_diffs(got, reference).items():
                rows.append((name, key, diff, float(reference[key].abs().max())))
    print(f"{'checkpoint':<20} {'output':<14} {'max |vlp - ref|':>16} {'max |ref|':>10}")
    for name, key, diff, scale in rows:
        print(f"{name:<20} {key:<14} {diff:>16.2e} {scale:>10.3f}")
    print(f"largest difference: {max(r[2] for r in rows):.2e} (test tolerance 1e-4)")


if __name__ == "__main__":
    main()
