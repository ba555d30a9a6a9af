"""Step 2 of every build: the official wheel and the CUDA header packages, verified.

Both integration paths compile against the same inputs: the official wheel (its
``torch/include`` and libraries) and the CUDA headers, plus the runtime library to link
against, of the wheel's CUDA version from the registry. Everything is downloaded once into
the cache and checked against the sha256 that ``upstream.yaml`` pins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from build_scripts import fetch, matrix, progress, wheel_parts, wheelname
from build_scripts.errors import BuildError
from build_scripts.fsutil import digest_of, sha256_file


@dataclass(frozen=True)
class OfficialInputs:
    wheel: Path  # the official wheel, verified
    pin: matrix.WheelPin
    cuda_include: tuple[Path, ...]  # header directories of the CUDA packages
    cudart: Path  # libcudart.so.N to link against


def cached_wheel(cache: Path, pin: matrix.WheelPin) -> Path:
    """Where the official wheel is kept in the cache (it may not be there yet)."""
    return cache / "wheels" / pin.filename


def fetch_inputs(m: matrix.VersionMatrix, python: str, cache: Path) -> OfficialInputs:
    pin = m.wheel.for_python(python)
    progress.step(
        f"torch {m.um_version} for Python {python} ({m.integration} path): "
        f"official wheel {pin.filename}"
    )
    # ``===``: exactly the pinned version; ``==2.13.0`` also matches ``2.13.0+cpu``, which
    # pip prefers when the registry has both.
    wheel = fetch.pip_download(
        f"torch==={pin.version}",
        pin.filename,
        pin.sha256,
        cached_wheel(cache, pin).parent,
        python_version=python,
        platform=pin.platform,
        abi=pin.cp_tag,
    )
    cuda_include: list[Path] = []
    cudart: Path | None = None
    for pkg in m.cuda_packages:
        whl = fetch.pip_download(
            f"{pkg.name}==={pkg.version}",
            pkg.filename,
            pkg.sha256,
            cache / "cuda-wheels",
            python_version=python,
            platform=wheelname.parse(pkg.filename).platform,
        )
        lib = pkg.library
        root = wheel_parts.extract(
            whl,
            cache / "cuda" / f"{pkg.name}-{pkg.version}",
            under(pkg.include, lib),
            pkg.name,
        )
        cuda_include.append(wheel_parts.require(root / pkg.include, f"{pkg.name} headers"))
        if lib and "cudart" in Path(lib).name:
            cudart = wheel_parts.require(root / lib, f"{pkg.name} {Path(lib).name}")
    if cudart is None:
        raise BuildError(f"{m.directory}/upstream.yaml: no cuda_packages entry has libcudart")
    return OfficialInputs(wheel, pin, tuple(cuda_include), cudart)


def work_dir(cache: Path, kind: str, m: matrix.VersionMatrix, official: OfficialInputs) -> Path:
    """The one cache-key scheme of both paths: what is derived from one official wheel lives
    in ``<cache>/<kind>/<torch version>-<first 16 hex digits of the wheel's sha256>``."""
    return cache / kind / f"{m.torch_version}-{official.pin.sha256[:16]}"


def headers_and_libraries(m: matrix.VersionMatrix, official: OfficialInputs, cache: Path) -> Path:
    """The official wheel's ``torch/include`` and the c10 libraries the overlay library
    links against or replaces, extracted once per wheel."""
    wanted = {m.overlay.library, m.overlay.link_library, "torch/lib/libc10.so"}
    return wheel_parts.extract(
        official.wheel,
        work_dir(cache, "unpacked", m, official),
        lambda n: n.startswith("torch/include/") or n in wanted,
        "torch/include + c10 libraries",
    )


def wheel_files(
    m: matrix.VersionMatrix,
    official: OfficialInputs,
    pins: Iterable[matrix.UpstreamFile],
    cache: Path,
) -> Path:
    """The official wheel's copies of the pinned files, each checked against its sha256.

    For files that the wheel ships unchanged from upstream (Python sources): what a series
    patches on the injection path, and what the source path replaces in the wheel.
    """
    pins = tuple(pins)
    key = digest_of(sorted(f.path for f in pins))[:12]
    wanted = {f.path for f in pins}
    root = wheel_parts.extract(
        official.wheel,
        work_dir(cache, "wheel-files", m, official) / key,
        lambda n: n in wanted,
        "pinned Python files",
    )
    for f in pins:
        copy = wheel_parts.require(root / f.path, f"{f.path} in {official.pin.filename}")
        have = sha256_file(copy)
        if have != f.sha256:
            raise BuildError(
                f"{f.path} in {official.pin.filename} has sha256 {have}, upstream.yaml pins "
                f"{f.sha256}: the wheel does not ship the file the series was made for"
            )
    return root


def under(directory: str, also: str | None = None) -> Callable[[str], bool]:
    """Wheel member filter: everything under ``directory``, plus the file ``also``."""
    return lambda name: name.startswith(directory + "/") or name == also
