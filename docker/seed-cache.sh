#!/bin/sh
# torch-um-seed-cache SEED CACHE TORCH_VERSION PYTHON
#
# Copies into the build's download cache CACHE what a host's torch-um cache SEED (mounted
# read-only) already holds for one build: the official wheel of TORCH_VERSION for Python
# PYTHON, the CUDA header packages, the upstream source tarballs and verified upstream
# files. Only those (the host's own build products stay out: they were made by another
# compiler), and only files CACHE lacks. Whatever is missing is downloaded by the build.
# The names follow the cache layout of build_scripts (wheels/, cuda-wheels/, src/,
# upstream/); a name that no longer matches only costs a download.
set -eu
seed=$1 cache=$2 version=$3 python=$4
tag=cp$(echo "$python" | tr -d .)
mkdir -p "$cache"
cd "$seed" 2>/dev/null || exit 0
n=0
for rel in wheels/torch-"$version"-"$tag"-"$tag"-*.whl cuda-wheels src upstream/"$version"-*; do
    [ -e "$rel" ] || continue
    mkdir -p "$cache/$(dirname "$rel")"
    cp -an "$rel" "$cache/$(dirname "$rel")/"
    n=$((n + 1))
done
echo "seeded $cache from the host cache ($n entries for torch $version, Python $python)"
