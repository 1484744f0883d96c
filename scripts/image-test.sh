#!/usr/bin/env bash
# Build the image from the real docker/Dockerfile with buildah (chroot isolation: no Docker daemon, no cgroups) on
# an mmdebstrap Debian bookworm base, then run checks inside it as uid 10001 with the root filesystem read-only:
#   vlp --help; a tiny synth -> ingest -> extract-frames -> mine-entities chain; the multi-node TrainJob's node
#   command (components/trainjob.py) with only the PET_* variables a torch-distributed runtime sets, training the
#   prompter one step; an import of every KFP component module and pipeline; every installed package that
#   requirements/constraints.txt pins at its pinned version.
#
#   scripts/image-test.sh            # `make image-test`
#
# Environment:
#   IMAGE_TEST_CACHE   where the base rootfs tarball is kept between runs (default .cache/image-test; never in git)
#   IMAGE_TEST_MIN_FREE_GIB  stop before building unless the container storage and /var/tmp have this much free
#                      (default 23: a cold build of the 7 GB image peaked at 21.6 GiB more in use here)
#   TORCH_INDEX_URL    the torch index the build uses (default: the host pip's first file:// index holding torch,
#                      else https://pypi.org/simple, a CUDA build of several GB)
# The host's pip settings (certificate, extra indexes, find-links) go into the build through a generated pip.conf;
# local index folders they name and /etc/ssl/certs are mounted read-only. Needs root (buildah, mmdebstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${IMAGE_TEST_CACHE:-.cache/image-test}
BASE_IMAGE=localhost/vlp-base:bookworm
IMAGE=localhost/vlp:image-test
mkdir -p "$CACHE"
say() { printf '\n== %s\n' "$*"; }

for tool in buildah mmdebstrap podman; do
  command -v "$tool" > /dev/null || {
    say "installing $tool"
    apt-get update -q > /dev/null && apt-get install -y -q buildah mmdebstrap podman > /dev/null
  }
done

if ! podman image exists "$BASE_IMAGE" 2> /dev/null; then
  if [ ! -s "$CACHE/bookworm.tar" ]; then
    say "base rootfs: mmdebstrap bookworm (python3, venv, python-is-python3)"
    mmdebstrap --variant=minbase --format=tar --include=python3,python3-venv,python-is-python3,ca-certificates \
      bookworm "$CACHE/bookworm.tar.part" && mv "$CACHE/bookworm.tar.part" "$CACHE/bookworm.tar"
  fi
  podman import "$CACHE/bookworm.tar" "$BASE_IMAGE" > /dev/null
fi

# The host pip's settings, for the build's pip (a proxy's CA and local indexes only the host knows)
python3 - "$CACHE/pip.conf" "$CACHE/mounts" <<'PY'
import subprocess, sys
values = {}
for line in subprocess.run(["pip", "config", "list"], capture_output=True, text=True).stdout.splitlines():
    key, _, value = line.partition("=")
    values[key.split(".", 1)[-1]] = value.strip().strip("'")
keep = {k: values[k] for k in ("cert", "extra-index-url", "find-links", "index-url") if k in values}
with open(sys.argv[1], "w") as f:
    f.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in keep.items()))
paths = set()
for key in ("extra-index-url", "find-links", "index-url"):
    for item in keep.get(key, "").split():
        path = item.removeprefix("file://")
        if path.startswith("/"):
            paths.add(path.rstrip("/").removesuffix("/simple") if path.rstrip("/").endswith("/simple") else path)
open(sys.argv[2], "w").write("\n".join(sorted(paths)) + "\n")
PY
mounts=(-v /etc/ssl/certs:/etc/ssl/certs:ro -v "$PWD/$CACHE/pip.conf:/etc/pip.conf:ro")
while read -r path; do [ -n "$path" ] && [ -d "$path" ] && mounts+=(-v "$path:$path:ro"); done < "$CACHE/mounts"
if [ -z "${TORCH_INDEX_URL:-}" ]; then
  TORCH_INDEX_URL=https://pypi.org/simple
  while read -r path; do
    [ -d "$path/simple/torch" ] && { TORCH_INDEX_URL="file://$path/simple"; break; }
  done < "$CACHE/mounts"
fi

# The disk a cold build needs: about 3x the largest layer (torch, 5.8 GB) at its commit (the container's files,
# the layer as a blob in /var/tmp, the stored layer), plus the layers before it. A cached rebuild needs far less,
# but which layers hit the cache is not known before: refuse at once rather than fail ten minutes in.
storage=$(buildah info --format '{{index .store "GraphRoot"}}' 2> /dev/null || echo /var/lib/containers/storage)
mkdir -p "$storage"
free_mib() { df --output=avail -B1M "$1" | tail -1; }
used_mib() { df --output=used -B1M "$1" | tail -1; }
need_mib=$(( ${IMAGE_TEST_MIN_FREE_GIB:-23} * 1024 ))
if [ "$(free_mib "$storage")" -lt "$need_mib" ] || [ "$(free_mib /var/tmp)" -lt "$need_mib" ]; then
  echo "image-test: the build needs about ${IMAGE_TEST_MIN_FREE_GIB:-23} GiB free for $storage and /var/tmp;" \
    "free: $(( $(free_mib "$storage") / 1024 )) GiB and $(( $(free_mib /var/tmp) / 1024 )) GiB" >&2
  exit 1
fi

say "build: docker/Dockerfile (torch from $TORCH_INDEX_URL; $(( $(free_mib "$storage") / 1024 )) GiB free)"
start=$(date +%s)
disk_before=$(used_mib "$storage")
peak_file=$(mktemp)
( peak=0; while :; do used=$(used_mib "$storage"); [ "$used" -gt "$peak" ] && { peak=$used; echo "$peak" > "$peak_file"; }
    sleep 2; done ) &
sampler=$!
trap 'kill "$sampler" 2> /dev/null || true' EXIT
# --format docker: the OCI format has no SHELL, and buildah would drop the Dockerfile's pipefail. The host pip's
# index list names folders that are not indexes of every package; pip's line for each of those is dropped.
buildah bud --isolation chroot --layers --format docker --quiet "${mounts[@]}" \
  --build-arg PYTHON_IMAGE="$BASE_IMAGE" --build-arg TORCH_INDEX_URL="$TORCH_INDEX_URL" \
  -f docker/Dockerfile -t "$IMAGE" . \
  2> >(grep -v -e "is ignored: it is neither a file nor a directory" -e "installed using the legacy 'setup.py install'" >&2) \
  > /dev/null
kill "$sampler"
peak_mib=$(( $(cat "$peak_file" 2> /dev/null || echo "$disk_before") - disk_before ))
rm -f "$peak_file"
# Images no longer named nor under the new one (an earlier build's): their layers would pile up, run after run
buildah rmi --prune > /dev/null 2>&1 || true
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "built $IMAGE in $(( $(date +%s) - start )) s; image size $(( size / 1024 / 1024 )) MiB;" \
  "disk in use at the build's peak: $(( peak_mib / 1024 )).$(( peak_mib % 1024 * 10 / 1024 )) GiB more than before it"

# Run commands in the image as uid 10001 with its root filesystem read-only (buildah run cannot): the container's
# rootfs bind-mounted read-only in a private mount namespace, with /dev, /proc, an output folder at /work and tmpfs
# at /tmp and the home directory (what a pod's emptyDirs give), a 64 MiB tmpfs at /dev/shm (what the container
# runtime gives a pod without an shm_size volume; the host's may not be writable by uid 10001), the image's
# environment, chroot.
ctr=$(buildah from "$IMAGE")
mnt=$(buildah mount "$ctr")
work=$(mktemp -d)
chmod 777 "$work"
mkdir -p "$mnt/work"
cleanup() { buildah umount "$ctr" > /dev/null 2>&1 || true; buildah rm "$ctr" > /dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
read -ra image_env <<< "$(buildah inspect --type image --format '{{range .OCIv1.Config.Env}}{{.}} {{end}}' "$IMAGE")"
inside() {
  unshare -m bash -c 'set -e; m=$1; w=$2; shift 2
    mount --bind "$m" "$m"; mount --bind /dev "$m/dev"; mount -t proc proc "$m/proc"
    mount -t tmpfs -o mode=1777,size=64m shm "$m/dev/shm"
    mount --bind "$w" "$m/work"; mount -t tmpfs tmpfs "$m/tmp"; mount -t tmpfs tmpfs "$m/home/vlp"
    mount -o remount,bind,ro "$m"
    exec chroot --userspec=10001:10001 "$m" /usr/bin/env -i "$@"' _ "$mnt" "$work" "${image_env[@]}" "$@"
}

say "as uid $(inside id -u), root filesystem read-only: vlp --help"
if inside touch /opt/vlp/probe 2> /dev/null; then echo "the root filesystem is writable"; exit 1; fi
inside vlp --help > /dev/null
say "tiny chain: synth -> ingest -> extract-frames -> mine-entities"
inside bash -c 'cd /opt/vlp && set -e
  for step in "data synth --out /work/raw" "ingest --source /work/raw --out /work/ds" \
              "extract-frames --dataset /work/ds --out /work/fr" "mine-entities --dataset /work/ds --out /work/ent"; do
    vlp $step --config configs/tiny.yaml > /dev/null 2>&1 || { echo "failed: vlp $step"; exit 1; }
  done
  python -c "import json; s = json.load(open(\"/work/fr/summary.json\")); print(\"frames of\", s[\"stored_videos\"], \"videos\")"'
say "the TrainJob node command (components/trainjob.py) as the torch-distributed runtime runs it: PET_* only"
inside bash -c 'cd /opt/vlp && set -e
  PET_NNODES=1 PET_NPROC_PER_NODE=1 PET_NODE_RANK=0 PET_MASTER_ADDR=127.0.0.1 PET_MASTER_PORT=29511 python -c "
import os, subprocess, sys
from components import trainjob
command, args = trainjob.command([\"pretrain-prompter\", \"--dataset\", \"/work/ds\", \"--frames\", \"/work/fr\",
                                  \"--out\", \"/work/prompter\"], [\"pretrain.max_steps=1\"])
env = {**os.environ, trainjob.CONFIG_ENV: open(\"configs/tiny.yaml\").read()}
sys.exit(subprocess.run(command + args, env=env, stdout=subprocess.DEVNULL).returncode)"
  python -c "import json; s = json.load(open(\"/work/prompter/summary.json\")); assert s[\"steps\"] == 1, s
print(\"the node command trained the prompter\", s[\"steps\"], \"step; loss\", round(s[\"metrics\"][\"train/loss\"], 4))"'
say "vlp serve on the read-only root: KServe's SDK and LanceDB import, the page ships, a missing index is one line"
inside bash -c 'cd /opt/vlp && set -e
  python -c "
import lancedb
from vlp.serve import server
from vlp.serve.api import PAGE
assert PAGE.is_file(), PAGE
print(\"kserve and lancedb\", lancedb.__version__, \"import; the page is\", PAGE.stat().st_size, \"bytes\")"
  set +e; vlp serve --index /work/no-index --port 0 > /work/serve.out 2> /work/serve.err; rc=$?; set -e
  [ "$rc" = 2 ] || { echo "vlp serve without an index exited $rc, not 2"; cat /work/serve.err; exit 1; }
  ! grep -q Traceback /work/serve.err || { echo "a traceback:"; cat /work/serve.err; exit 1; }
  echo "vlp serve --index /work/no-index: exit 2, $(grep -c . /work/serve.err) line(s)"'
say "imports: every component module and pipeline"
inside bash -c 'cd /opt/vlp && python -c "
import importlib, pkgutil
import components, pipelines
names = [f\"{p.__name__}.{m.name}\" for p in (components, pipelines) for m in pkgutil.iter_modules(p.__path__)]
for name in names:
    importlib.import_module(name)
print(len(names), \"modules imported\")"'
say "installed versions vs requirements/constraints.txt"
inside pip list --format=freeze > "$work/freeze.txt"
python3 - requirements/constraints.txt "$work/freeze.txt" <<'PY'
import re, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
pins = {}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, version = line.split("==", 1)
        pins[norm(name)] = version.strip()
installed = {}
for line in open(sys.argv[2]):
    if "==" in line:
        name, version = line.strip().split("==", 1)
        installed[norm(name)] = version
wrong = {n: (installed[n], v) for n, v in pins.items() if n in installed and installed[n].split("+")[0] != v.split("+")[0]}
unpinned = sorted(n for n in installed if n not in pins and n not in ("pip", "setuptools", "wheel", "vlp"))
print(f"{sum(n in installed for n in pins)} pinned packages installed; {len(wrong)} at another version; "
      f"{len(unpinned)} installed without a pin")
for name, (have, want) in sorted(wrong.items()):
    print(f"  {name}: {have} installed, {want} pinned")
for name in unpinned:
    print(f"  {name}: not in constraints.txt")
sys.exit(1 if wrong or unpinned else 0)
PY
say "image test passed"
