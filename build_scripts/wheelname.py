"""Wheel file names, read with ``packaging.utils.parse_wheel_filename`` (PEP 427/491).

The one reader of wheel names in the pipeline: the registry pins (matrix.py), the CUDA
packages pip downloads (official.py) and the repacked ``+um`` wheel (repack.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from build_scripts.errors import BuildError


@dataclass(frozen=True)
class WheelName:
    name: str  # the distribution as the file spells it ("torch")
    version: str  # "2.10.0", "2.13.0+cpu"
    build: str | None  # build tag ("3" in torch-2.10.0-3-cp311-...), if any
    python: str  # "cp311"
    abi: str  # "cp311"
    platforms: tuple[str, ...]  # sorted; more than one for a compressed tag set

    @property
    def platform(self) -> str:
        """One platform tag: pip's ``--platform`` takes one, and any of them selects it."""
        return self.platforms[0]

    def filename(self) -> str:
        build = f"-{self.build}" if self.build else ""
        plat = ".".join(self.platforms)
        return f"{self.name}-{self.version}{build}-{self.python}-{self.abi}-{plat}.whl"


def parse(filename: str) -> WheelName:
    try:
        name, version, build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise BuildError(f"{filename} is not a wheel file name: {exc}") from None
    pairs = {(t.interpreter, t.abi) for t in tags}
    if len(pairs) != 1:
        raise BuildError(
            f"{filename}: expected one python-abi tag pair, found "
            + ", ".join(sorted(f"{i}-{a}" for i, a in pairs))
        )
    ((python, abi),) = pairs
    # The distribution name as spelled in the file (normalised names lose nothing for torch).
    spelled = filename.split("-", 1)[0]
    return WheelName(
        name=spelled if spelled.lower().replace("_", "-") == name else str(name),
        version=str(version),
        build=f"{build[0]}{build[1]}" if build else None,
        python=python,
        abi=abi,
        platforms=tuple(sorted({t.platform for t in tags})),
    )
