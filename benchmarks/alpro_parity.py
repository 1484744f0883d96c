"""Print how far vlp's ALPRO is from the reference code on the parity fixture: max |vlp - reference| per output.

    python benchmarks/alpro_parity.py

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_import_checkpoint import FIXTURE, WORDS, _retrieval_outputs  # noqa: E402
from vlp.config import load_config  # noqa: E402
from vlp.models import directory  # noqa: E402
from vlp.steps.import_checkpoint import import_checkpoint  # noqa: E402


def main() -> None:
    x = torch.load(FIXTURE / "inputs.pt", weights_only=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tok = Path(tmp) / "tok"
        tok.mkdir()
        vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
        (tok / "vocab.txt").write_text("\n".join(vocab) + "\n")
        (tok / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
        answers = Path(tmp) / "answers.json"
        answers.write_text(json.dumps(["a", "b", "c", "d", "e"]))
        for name, ref in (("alpro_pretrain.pt", "outputs_alpro.pt"), ("lavis_retrieval.pt", "outputs_lavis.pt"),
                          ("alpro_qa.pt", "outputs_alpro.pt"), ("lavis_qa.pt", "outputs_lavis.pt")):  # fmt: skip
            out = str(Path(tmp) / name)
            qa = "qa" in name
            import_checkpoint(str(FIXTURE / name), out, load_config(None), tokenizer=str(tok), video_heads=2,
                              text_heads=2, answers=str(answers) if qa else "")  # fmt: skip
            model, _, _ = directory.load(out)
            reference = torch.load(FIXTURE / ref, weights_only=True)
            with torch.no_grad():
                got = (
                    {"qa_logits": model(x["video"], x["input_ids"], x["attention_mask"])}
                    if qa
                    else _retrieval_outputs(model, x)
                )
            for key, value in got.items():
                diff = float((value.detach() - reference[key]).abs().max())
                rows.append((name, key, diff, float(reference[key].abs().max())))
    print(f"{'checkpoint':<20} {'output':<14} {'max |vlp - ref|':>16} {'max |ref|':>10}")
    for name, key, diff, scale in rows:
        print(f"{name:<20} {key:<14} {diff:>16.2e} {scale:>10.3f}")
    print(f"largest difference: {max(r[2] for r in rows):.2e} (test tolerance 1e-4)")


if __name__ == "__main__":
    main()
