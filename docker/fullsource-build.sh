#!/bin/bash
# docker/fullsource-build.sh: the full-source build of the `fullsource-build` stage of
# docker/Dockerfile. Run from the repository root inside that stage (manylinux_2_28
# toolchain + CUDA toolkit in $CUDA_HOME); it
#   1. fetches upstream at the pinned commit (patches/X.Y.Z/upstream.yaml: repository,
#      commit) with submodules;
#   2. applies patches/X.Y.Z/series in order with `git apply` (no fuzz, no offset slack);
#   3. adds the engine of c10_overlay/ (c10/cuda/um, and c10_overlay/torch/** as the
#      overlay build does) and builds it into c10_cuda;
#   4. builds the whole wheel with `setup.py bdist_wheel` under the official build
#      variables (USE_CUDA, TORCH_CUDA_ARCH_LIST, PYTORCH_BUILD_VERSION=X.Y.Z+um,
#      PYTORCH_BUILD_NUMBER, the wheel's C++ ABI, the official dependency pins), with
#      ccache in $CCACHE_DIR;
#   5. tags it for the platform the stage builds for ($AUDITWHEEL_PLAT of the manylinux
#      image) and writes it to --out.
set -euo pipefail

torch_version=2.6.0 python=3.11 cuda=12.4 arch_list="" build_number=1 max_jobs="" out=/out
while [ $# -gt 0 ]; do
    case $1 in
    --torch-version) torch_version=$2 ;;
    --python) python=$2 ;;
    --cuda) cuda=$2 ;;
    --arch-list) arch_list=$2 ;;
    --build-number) build_number=$2 ;;
    --max-jobs) max_jobs=$2 ;;
    --out) out=$2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift 2
done

repo_root=$(pwd)
pins=patches/$torch_version/upstream.yaml
lock=docker/requirements/fullsource-$torch_version-py$python.txt
for f in "$pins" "$lock" "patches/$torch_version/series"; do
    [ -f "$f" ] || { echo "missing $f: no full-source build is defined for torch $torch_version / Python $python" >&2; exit 1; }
done
[ -x "${CUDA_HOME:-/nonexistent}/bin/nvcc" ] || { echo "no nvcc in CUDA_HOME=${CUDA_HOME:-}" >&2; exit 1; }

# Build environment: hash-pinned build requirements in their own venv.
venv=/opt/torch-um/fullsource
python -m venv "$venv"
"$venv/bin/pip" install --require-hashes --no-deps -r "$lock"
export PATH=$venv/bin:$PATH
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

pin() { "$venv/bin/python" -c 'import sys, yaml; d = yaml.safe_load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d = d[k]
print(d)' "$pins" "$1"; }
repository=$(pin upstream.repository)
tag=$(pin upstream.tag)
commit=$(pin upstream.commit)
cxx11_abi=$(pin wheel.cxx11_abi)

# 1. Upstream at the pinned tag, with submodules.
src=/build/pytorch
rm -rf "$src"
# The pinned commit is the one the official wheel was built from (its git_version), which
# need not be the commit the release tag points at: fetch that commit itself.
git init -q "$src"
git -C "$src" remote add origin "$repository"
git -C "$src" fetch --depth 1 origin "$commit"
git -C "$src" checkout -q FETCH_HEAD
git -C "$src" submodule update --init --recursive --depth 1 --jobs 8
echo "upstream $tag at $(git -C "$src" rev-parse HEAD)"

# 2. The series, strictly.
grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "patches/$torch_version/series" |
    while read -r patch; do
        echo "applying $patch"
        git -C "$src" apply --verbose "$repo_root/patches/$torch_version/$patch"
    done

# 3. The engine (and its Python helpers) into the tree, built into c10_cuda.
cp -a c10_overlay/c10/cuda/um "$src/c10/cuda/um"
if [ -d c10_overlay/torch ]; then
    (cd c10_overlay && find torch -type f ! -name '*.pyc' ! -path '*/__pycache__/*' \
        -exec cp --parents {} "$src/" \;)
fi
# patches/X.Y.Z/0003 makes c10/cuda/CMakeLists.txt compile c10/cuda/um/*.cpp into c10_cuda.
grep -q 'C10_CUDA_UM_SRCS' "$src/c10/cuda/CMakeLists.txt" ||
    { echo "the series of torch $torch_version does not build the engine into c10_cuda" >&2; exit 1; }

# 4. The official build variables. The wheel's dependencies are the official wheel's
#    (the runtime lock of the same version lists them, with the versions pinned there).
extra_reqs=$(grep -E '^nvidia-|^triton==' "docker/requirements/runtime-$torch_version-py$python.txt" |
    sed -e 's/ *\\$//' -e "s/\$/; platform_system == 'Linux' and platform_machine == 'x86_64'/" |
    paste -sd'|' - | sed 's/|/ | /g')
export USE_CUDA=1 USE_CUDNN=1 USE_NCCL=1 USE_DISTRIBUTED=1 USE_KINETO=1 \
    USE_CUSPARSELT=0 BUILD_TEST=0 USE_CCACHE=1 \
    CMAKE_BUILD_TYPE=Release \
    TORCH_CUDA_ARCH_LIST="${arch_list:-5.0;6.0;7.0;7.5;8.0;8.6;9.0}" \
    PYTORCH_BUILD_VERSION="$torch_version+um" \
    PYTORCH_BUILD_NUMBER="$build_number" \
    PYTORCH_EXTRA_INSTALL_REQUIREMENTS="$extra_reqs" \
    _GLIBCXX_USE_CXX11_ABI="$cxx11_abi" \
    CUDNN_INCLUDE_DIR="$site/nvidia/cudnn/include" \
    CUDNN_LIBRARY="$site/nvidia/cudnn/lib/libcudnn.so.9" \
    CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache \
    CMAKE_CUDA_COMPILER_LAUNCHER=ccache
[ -z "$max_jobs" ] || export MAX_JOBS="$max_jobs"
command -v ccache >/dev/null || unset CMAKE_C_COMPILER_LAUNCHER CMAKE_CXX_COMPILER_LAUNCHER CMAKE_CUDA_COMPILER_LAUNCHER
echo "building torch $PYTORCH_BUILD_VERSION (CUDA $cuda, arch $TORCH_CUDA_ARCH_LIST, C++11 ABI $cxx11_abi)"
(cd "$src" && python setup.py bdist_wheel)

# 5. The platform tag: the stage links with the manylinux toolchain, so the wheel has the
#    image's policy ($AUDITWHEEL_PLAT); `auditwheel show` prints what it finds, for the log.
mkdir -p "$out"
for whl in "$src"/dist/torch-*.whl; do
    auditwheel show "$whl" || true
    if [ -n "${AUDITWHEEL_PLAT:-}" ]; then
        python -m wheel tags --remove --platform-tag "$AUDITWHEEL_PLAT" "$whl" >/dev/null
    fi
done
cp "$src"/dist/torch-*.whl "$out/"
ls -l "$out"
