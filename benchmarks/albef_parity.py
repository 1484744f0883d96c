"""Print how far vlp's ALBEF is from the reference code on the parity fixture: max |vlp - reference| per output.

    python benchmarks/albef_parity.py

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
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_import_albef import CASES, FIXTURE, albef_outputs, inputs, max_diffs, write_tokenizer  # noqa: E402
from vlp.config import load_config  # noqa: E402
from vlp.models import directory  # noqa: E402
from vlp.steps.import_checkpoint import import_checkpoint  # noqa: E402


def main() -> None:
    x = inputs()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tok = write_tokenizer(Path(tmp) / "tok")
        for name, fmt, _, ref in CASES:
            out = str(Path(tmp) / name)
            import_checkpoint(str(FIXTURE / name), out, load_config(None), tokenizer=tok, video_heads=2,
                              text_heads=2)  # fmt: skip
            model, _, _ = directory.load(out)
            reference = torch.load(FIXTURE / ref, weights_only=True)
            got = albef_outputs(model, x)
            for key, diff in max_diffs(got, reference).items():
                rows.append((f"{name} ({fmt})", key, diff, float(reference[key].abs().max())))
    print(f"{'checkpoint':<28} {'output':<16} {'max |vlp - ref|':>16} {'max |ref|':>10}")
    for name, key, diff, scale in rows:
        print(f"{name:<28} {key:<16} {diff:>16.2e} {scale:>10.3f}")
    print(f"largest difference: {max(r[2] for r in rows):.2e} (test tolerance 1e-4)")


if __name__ == "__main__":
    main()
