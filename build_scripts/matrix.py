"""The version matrix: ``patches/<version>/upstream.yaml`` as frozen dataclasses.

A torch version is supported when ``patches/<version>/upstream.yaml`` exists. The file
pins everything the build reads from outside the repository: the official wheels, the
CUDA header packages, the upstream source files and where they can be fetched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from build_scripts import wheelname
from build_scripts.errors import BuildError
from build_scripts.paths import patches_root

SCHEMA = 1
Integration = Literal["source", "inject"]
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class WheelPin:
    """One official wheel on the registry, for one CPython version."""

    python: str  # "3.11"
    filename: str
    sha256: str

    @property
    def cp_tag(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def platform(self) -> str:
        """The platform tag in the registry file name (e.g. ``manylinux1_x86_64``)."""
        return wheelname.parse(self.filename).platform

    @property
    def version(self) -> str:
        """The exact version in the file name (``2.13.0``; ``2.13.0+cpu`` would differ)."""
        return wheelname.parse(self.filename).version


@dataclass(frozen=True)
class WheelInfo:
    cuda: str  # CUDA version of the official build, e.g. "12.4"
    local_label: str  # the label in torch/version.py that "+um" replaces, e.g. "cu124"
    cxx11_abi: int  # _GLIBCXX_USE_CXX11_ABI of the official build
    files: tuple[WheelPin, ...]

    def for_python(self, python: str) -> WheelPin:
        for pin in self.files:
            if pin.python == python:
                return pin
        have = ", ".join(p.python for p in self.files)
        raise BuildError(
            f"no official wheel pinned for Python {python}; this torch version has: {have}. "
            "Pass one of those (PYTHON=...), or add the wheel's file name and sha256 to "
            "upstream.yaml."
        )


@dataclass(frozen=True)
class CudaPackage:
    """A CUDA header/library package from the registry (a py3-none wheel)."""

    name: str
    version: str
    filename: str
    sha256: str
    include: str  # include directory inside the wheel
    library: str | None = None  # a library inside the wheel the build links against


@dataclass(frozen=True)
class Upstream:
    tag: str
    commit: str
    repository: str  # git URL of the upstream repository


@dataclass(frozen=True)
class DebianSource:
    package: str
    version: str
    suite: str
    component: str
    orig_tarball: str
    sha256: str
    top_dir: str


@dataclass(frozen=True)
class Overlay:
    """What the overlay build replaces inside the wheel and what its ELF may differ in."""

    library: str  # path inside the wheel, e.g. torch/lib/libc10_cuda.so
    soname: str
    link_library: str  # the wheel library the rebuilt one links against (libc10.so)
    needed_may_add: tuple[str, ...] = ()
    needed_may_drop: tuple[str, ...] = ()


@dataclass(frozen=True)
class UpstreamFile:
    path: str
    sha256: str


@dataclass(frozen=True)
class VersionMatrix:
    torch_version: str
    integration: Integration
    upstream: Upstream
    wheel: WheelInfo
    cuda_packages: tuple[CudaPackage, ...]
    debian: DebianSource | None
    overlay: Overlay
    sources: tuple[UpstreamFile, ...]
    directory: Path  # patches/<version>
    #: the record of a passed run of tests/gpu on a GPU host (path in the repository), or
    #: None: not verified on a GPU. The default version is the newest one that has one.
    gpu_verified: str | None = None

    @property
    def um_version(self) -> str:
        return f"{self.torch_version}+um"

    @property
    def series_file(self) -> Path:
        return self.directory / "series"


def supported_versions(root: Path | None = None) -> list[str]:
    root = root or patches_root()
    if not root.is_dir():
        return []
    found = [d.name for d in root.iterdir() if (d / "upstream.yaml").is_file()]
    return sorted(found, key=_version_key)


def default_version(root: Path | None = None) -> str:
    """The newest supported version whose ``upstream.yaml`` names a GPU record
    (``gpu_verified``): what ``make build`` builds when no TORCH_VERSION is given."""
    root = root or patches_root()
    verified = [v for v in supported_versions(root) if load(v, root).gpu_verified]
    if not verified:
        raise BuildError(
            f"no version under {root} is verified on a GPU (gpu_verified in upstream.yaml): "
            "pass TORCH_VERSION=<version>"
        )
    return verified[-1]


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) if x.isdigit() else -1 for x in v.split("."))


def load(torch_version: str, root: Path | None = None) -> VersionMatrix:
    """Load and validate ``patches/<torch_version>/upstream.yaml``."""
    root = root or patches_root()
    versions = supported_versions(root)
    if torch_version not in versions:  # by name: never a path, never empty
        listed = ", ".join(versions) if versions else "none"
        example = ""
        if versions:
            try:
                suggest = default_version(root)
            except BuildError:
                suggest = versions[-1]
            example = f", e.g. `make build TORCH_VERSION={suggest}`"
        raise BuildError(
            f"unknown TORCH_VERSION {torch_version!r}: supported versions are {listed}; "
            f"set TORCH_VERSION to one of them{example}"
        )
    path = root / torch_version / "upstream.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise BuildError(f"{path} is not valid YAML: {exc}") from None
    return parse(raw, path)


def parse(raw: Any, path: Path) -> VersionMatrix:
    r = _Reader(path)
    doc = r.mapping(raw, "")
    schema = r.get(doc, "schema", int, "")
    if schema != SCHEMA:
        raise BuildError(f"{path}: schema {schema} is not supported (expected {SCHEMA})")
    version = r.get(doc, "torch_version", str, "")
    if path.parent.name != version:
        raise BuildError(
            f"{path}: torch_version {version!r} does not match its directory {path.parent.name!r}"
        )
    integration = r.get(doc, "integration", str, "")
    if integration not in ("source", "inject"):
        raise BuildError(f"{path}: integration must be 'source' or 'inject', got {integration!r}")

    up = r.mapping(doc.get("upstream"), "upstream")
    upstream = Upstream(
        tag=r.get(up, "tag", str, "upstream"),
        commit=r.match(r.get(up, "commit", str, "upstream"), _COMMIT, "upstream.commit"),
        repository=r.get(up, "repository", str, "upstream"),
    )

    wh = r.mapping(doc.get("wheel"), "wheel")
    files_raw = r.mapping(wh.get("files"), "wheel.files")
    pins = []
    for py, entry in files_raw.items():
        e = r.mapping(entry, f"wheel.files.{py}")
        pins.append(
            WheelPin(
                python=str(py),
                filename=r.get(e, "filename", str, f"wheel.files.{py}"),
                sha256=r.sha(r.get(e, "sha256", str, f"wheel.files.{py}"), f"wheel.files.{py}"),
            )
        )
    wheel = WheelInfo(
        cuda=str(r.get(wh, "cuda", str, "wheel")),
        local_label=r.get(wh, "local_label", str, "wheel"),
        cxx11_abi=r.get(wh, "cxx11_abi", int, "wheel"),
        files=tuple(pins),
    )

    cuda_pkgs = []
    for i, item in enumerate(r.seq(doc.get("cuda_packages", []), "cuda_packages")):
        ctx = f"cuda_packages[{i}]"
        e = r.mapping(item, ctx)
        lib = e.get("library")
        cuda_pkgs.append(
            CudaPackage(
                name=r.get(e, "name", str, ctx),
                version=str(r.get(e, "version", str, ctx)),
                filename=r.get(e, "filename", str, ctx),
                sha256=r.sha(r.get(e, "sha256", str, ctx), ctx),
                include=r.get(e, "include", str, ctx),
                library=str(lib) if lib is not None else None,
            )
        )

    debian = None
    if doc.get("debian") is not None:
        d = r.mapping(doc["debian"], "debian")
        debian = DebianSource(
            package=r.get(d, "package", str, "debian"),
            version=str(r.get(d, "version", str, "debian")),
            suite=r.get(d, "suite", str, "debian"),
            component=str(d.get("component", "main")),
            orig_tarball=r.get(d, "orig_tarball", str, "debian"),
            sha256=r.sha(r.get(d, "sha256", str, "debian"), "debian"),
            top_dir=r.get(d, "top_dir", str, "debian"),
        )

    ov = r.mapping(doc.get("overlay"), "overlay")
    overlay = Overlay(
        library=r.get(ov, "library", str, "overlay"),
        soname=r.get(ov, "soname", str, "overlay"),
        link_library=r.get(ov, "link_library", str, "overlay"),
        needed_may_add=tuple(str(x) for x in r.seq(ov.get("needed_may_add", []), "overlay")),
        needed_may_drop=tuple(str(x) for x in r.seq(ov.get("needed_may_drop", []), "overlay")),
    )

    src = r.mapping(doc.get("sources", {}), "sources")
    sources = tuple(
        UpstreamFile(path=str(p), sha256=r.sha(str(h), f"sources.{p}")) for p, h in src.items()
    )
    for f in sources:
        if f.path.startswith("/") or ".." in f.path.split("/"):
            raise BuildError(f"{path}: sources entry {f.path!r} must be a relative path")
    if integration == "source" and not sources:
        raise BuildError(f"{path}: integration 'source' needs a non-empty 'sources' map")

    gpu = doc.get("gpu_verified")
    if gpu is not None:
        gpu = r.get(doc, "gpu_verified", str, "")
        record = path.parent.parent.parent / gpu  # patches/<version>/upstream.yaml
        if gpu.startswith("/") or ".." in gpu.split("/") or not record.is_file():
            raise BuildError(
                f"{path}: gpu_verified must name a GPU record in the repository, "
                f"and {gpu!r} is not one"
            )

    return VersionMatrix(
        torch_version=version,
        integration=cast(Integration, integration),
        upstream=upstream,
        wheel=wheel,
        cuda_packages=tuple(cuda_pkgs),
        debian=debian,
        overlay=overlay,
        sources=sources,
        directory=path.parent,
        gpu_verified=gpu,
    )


class _Reader:
    """Small typed accessors that turn schema errors into BuildErrors naming the key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _fail(self, msg: str) -> BuildError:
        return BuildError(f"{self.path}: {msg}")

    def mapping(self, value: Any, ctx: str) -> Mapping[Any, Any]:
        if not isinstance(value, Mapping):
            raise self._fail(f"{ctx or 'top level'} must be a mapping")
        return value

    def seq(self, value: Any, ctx: str) -> list[Any]:
        if not isinstance(value, list):
            raise self._fail(f"{ctx} must be a list")
        return value

    def get(self, m: Mapping[Any, Any], key: str, typ: type, ctx: str) -> Any:
        where = f"{ctx}.{key}" if ctx else key
        if key not in m:
            raise self._fail(f"missing key {where}")
        value = m[key]
        if typ is str and isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, typ):
            raise self._fail(f"{where} must be a {typ.__name__}, got {value!r}")
        return value

    def match(self, value: str, pattern: re.Pattern[str], ctx: str) -> str:
        if not pattern.match(value):
            raise self._fail(f"{ctx} {value!r} is malformed")
        return value

    def sha(self, value: str, ctx: str) -> str:
        return self.match(value.lower(), _SHA256, f"{ctx} sha256")
