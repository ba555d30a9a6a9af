#!/bin/sh
# docker/local-base.sh KIND IMAGE
#
# Builds a local base image from Debian packages, with no container registry: a stand-in
# for the pinned registry bases where none can be pulled (the toolchain stage's manylinux
# base, the runtime image's CUDA base). KIND is
#   toolchain  Python, venv, g++, binutils, make, patch   (for docker/Dockerfile)
#   runtime    Python and venv                             (for docker/Dockerfile.runtime)
# The root file system is made by mmdebstrap (run as root) and imported with
# $CONTAINER (docker, podman or buildah; default buildah).
#
# Environment: DEBIAN_SUITE (bookworm), DEBIAN_MIRROR (mmdebstrap's default when empty),
# PYTHON (3.11; must be the suite's python3 minor version), SOURCE_DATE_EPOCH (file times
# and image creation time), CONTAINER, CONTAINER_FLAGS (global flags, e.g. --storage-driver vfs).
#
# A wheel built on such a base is tagged for the base's glibc (manylinux_2_34 on bookworm
# for what needs it), not manylinux_2_28: that needs the real manylinux base.
set -eu

kind=${1:?usage: $0 toolchain|runtime IMAGE}
image=${2:?usage: $0 toolchain|runtime IMAGE}
suite=${DEBIAN_SUITE:-bookworm}
python=${PYTHON:-3.11}
container=${CONTAINER:-buildah}
flags=${CONTAINER_FLAGS:-}
: "${SOURCE_DATE_EPOCH:=1738108800}"
export SOURCE_DATE_EPOCH

case $kind in
toolchain) pkgs="python$python,python$python-venv,g++,binutils,make,patch,xz-utils,ca-certificates" ;;
runtime) pkgs="python$python,python$python-venv,ca-certificates" ;;
*) echo "unknown kind '$kind' (toolchain or runtime)" >&2; exit 2 ;;
esac

command -v mmdebstrap >/dev/null || { echo "needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
# SC2016: "$1" is mmdebstrap's (the root directory), expanded by its hook shell.
# shellcheck disable=SC2086,SC2016  # DEBIAN_MIRROR is empty or one word
mmdebstrap --quiet --variant=apt --include="$pkgs" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    "$suite" "$tmp/rootfs.tar" ${DEBIAN_MIRROR:-}

path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
label="torch-um.local-base=$kind/debian-$suite"
case $container in
buildah)
    # shellcheck disable=SC2086  # flags are words
    ctr=$(buildah $flags from scratch)
    # shellcheck disable=SC2086
    buildah $flags add "$ctr" "$tmp/rootfs.tar" /
    # shellcheck disable=SC2086
    buildah $flags config --env PATH="$path" --env LANG=C.UTF-8 --cmd /bin/bash \
        --label "$label" "$ctr"
    # shellcheck disable=SC2086
    buildah $flags commit --rm --timestamp "$SOURCE_DATE_EPOCH" "$ctr" "$image"
    ;;
docker | podman)
    # shellcheck disable=SC2086
    "$container" $flags import --change "ENV PATH=$path" --change "ENV LANG=C.UTF-8" \
        --change 'CMD ["/bin/bash"]' --change "LABEL $label" "$tmp/rootfs.tar" "$image"
    ;;
*) echo "CONTAINER must be docker, podman or buildah, not '$container'" >&2; exit 2 ;;
esac
echo "local base image: $image ($kind, Debian $suite)"
