#!/usr/bin/env bash
# Build the scratch venv that benchmarks/speed/reference_step.py runs in: PyPI salesforce-lavis 1.0.2 (the reference
# ALPRO and ALBEF code) with only what importing its two model modules needs, and the project's own torch by symlink
# (no second CUDA wheel). It lives outside the repo and the project never imports it.
#   scripts/reference-venv.sh [DIR]     default DIR: ../scratch/lavis-venv (beside the checkout); needs .venv (make install)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-../scratch/lavis-venv}
src=$PWD/.venv/lib/python3.11/site-packages
[ -d "$src/torch" ] || { echo "reference-venv: $src/torch is missing: run make install first" >&2; exit 2; }
python3.11 -m venv "$dir"
pip=("$dir/bin/python" -m pip install --quiet)
"${pip[@]}" --no-deps "salesforce-lavis==1.0.2"
# LAVIS pins transformers >=4.25,<4.27; its package __init__ files (datasets, processors: decord, cv2, spacy) are
# skipped by the benchmark, so their requirements are not installed
"${pip[@]}" "transformers==4.26.1" omegaconf iopath einops pandas pyyaml
"${pip[@]}" --no-deps "timm==0.4.12" "fairscale==0.4.4"
"${pip[@]}" "sympy==1.14.0" "networkx==3.6.1" "jinja2==3.1.6" "setuptools>=77.0.3" pillow  # what torch imports
site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for name in torch torchgen functorch torchvision torchvision.libs "$src"/torch-*.dist-info "$src"/torchvision-*.dist-info; do
  ln -sfn "$src/$(basename "$name")" "$site/$(basename "$name")"
done
"$dir/bin/python" -c 'import torch, transformers; print("reference venv ready: torch", torch.__version__, "transformers", transformers.__version__)'
