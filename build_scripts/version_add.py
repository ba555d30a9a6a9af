"""``python -m build_scripts version add X.Y.Z``: a new injection-path version's folder.

 1. resolve   the official torch X.Y.Z wheels for every CPython the nearest version pins,
              exactly that version (``===``: a ``+cpu`` build under the same number is not
              it), through pip's own resolver and index configuration; a wheel without
              CUDA dependencies is refused
 2. download  each wheel, verified against the index's sha256, and read its facts:
              ``git_version``, CUDA version and local label (torch/version.py), the C++
              ABI flag (libc10.so's symbols), the CUDA runtime it depends on (METADATA)
 3. cuda      the CUDA runtime and ``crt/`` header packages of that CUDA version, resolved
              the way the wheel's own dependency resolves them, each with its sha256
 4. series    the nearest version's patches, applied with no fuzz and no offset to the new
              wheel's files; when they need fresh context they are refreshed, when they do
              not apply the difference between the two versions' files is printed
 5. write     ``patches/X.Y.Z/upstream.yaml``, ``series`` and the patches; rerun on an
              existing version it keeps that version's ``gpu_verified`` record
 6. check     the version's build (``pipeline.build``) unless ``--no-build``
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from build_scripts import abi, fetch, matrix, pipconf, progress, series, wheelname
from build_scripts.errors import BuildError
from build_scripts.fsutil import atomic_dir, sha256_file

#: platform tags pip may pick official and CUDA wheels for (newest first)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_DIFF_LINES = 120


@dataclass(frozen=True)
class Resolved:
    name: str
    version: str
    filename: str
    sha256: str
    requires: tuple[str, ...]


def resolve(spec: str, python: str, *, deps: bool) -> list[Resolved]:
    """What pip would install for ``spec`` on Linux x86-64 CPython ``python``, without
    downloading anything but metadata (``pip install --dry-run --report``)."""
    with tempfile.TemporaryDirectory(prefix="um-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
            "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            "--target", str(Path(tmp) / "t"), "--report", str(report),
        ]  # fmt: skip
        for plat in PLATFORMS:
            cmd += ["--platform", plat]
        if not deps:
            cmd.append("--no-deps")
        # A version cap in pip's configuration would refuse the very version being added;
        # the index configuration is kept (pipconf).
        proc = subprocess.run(
            [*cmd, spec],
            capture_output=True,
            text=True,
            check=False,
            env=pipconf.pinned_download_env(),
        )
        if proc.returncode != 0 or not report.is_file():
            raise BuildError(
                f"pip cannot resolve {spec} for Python {python} "
                f"({pipconf.reason(proc.stderr, proc.returncode)}): check the version and "
                "that the package index your pip configuration names serves it"
            )
        data = json.loads(report.read_text())
    out = []
    for item in data.get("install", []):
        info = item["download_info"]
        md = item["metadata"]
        out.append(
            Resolved(
                name=md["name"],
                version=md["version"],
                filename=info["url"].rsplit("/", 1)[-1].replace("%2B", "+"),
                sha256=info.get("archive_info", {}).get("hashes", {}).get("sha256", ""),
                requires=tuple(md.get("requires_dist", [])),
            )
        )
    return out


def as_fetched(r: Resolved, python: str, cache: Path) -> Resolved:
    """``r`` as the build's ``pip download`` gets it (official.fetch_inputs): the index may
    hold several files of one version (a plain and a compressed platform tag), and the pin
    must be the one pip picks for the platform the build passes. Downloaded and hashed."""
    platform = wheelname.parse(r.filename).platform
    dest_dir = cache / "cuda-wheels"
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".tmp-pin-", dir=dest_dir) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "--python-version", python, "--platform", platform,
            "--implementation", "cp", "--dest", tmp, f"{r.name}==={r.version}",
        ]  # fmt: skip
        proc = subprocess.run(
            cmd, capture_output=True, text=True, check=False, env=pipconf.pinned_download_env()
        )
        got = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(got) != 1:
            raise BuildError(
                fetch.refused(f"{r.name}==={r.version}", r.filename, dest_dir, proc.stderr,
                              proc.returncode, Path(tmp))
            )  # fmt: skip
        digest = sha256_file(got[0])
        if got[0].name == r.filename and r.sha256 and digest != r.sha256:
            raise BuildError(f"{r.filename}: sha256 {digest}, the index says {r.sha256}")
        shutil.move(str(got[0]), dest_dir / got[0].name)
        return Resolved(r.name, r.version, got[0].name, digest, r.requires)


def _one(found: list[Resolved], name: str, spec: str) -> Resolved:
    hits = [r for r in found if r.name.lower().replace("_", "-") == name]
    if len(hits) != 1 or not hits[0].sha256:
        raise BuildError(f"resolving {spec} gave no single {name} wheel with a sha256")
    return hits[0]


@dataclass(frozen=True)
class WheelFacts:
    git_version: str
    cuda: str
    local_label: str
    cxx11_abi: int


def wheel_facts(wheel: Path) -> WheelFacts:
    with zipfile.ZipFile(wheel) as zf:
        version_py = zf.read("torch/version.py").decode()
        with tempfile.TemporaryDirectory(prefix="um-facts-") as tmp:
            lib = Path(tmp) / "libc10.so"
            lib.write_bytes(zf.read("torch/lib/libc10.so"))
            exported = abi.read_elf(lib).exported

    def field(name: str) -> str | None:
        m = re.search(rf"^{name}(?:: \w+(?:\[\w+\])?)?\s*=\s*'([^']*)'", version_py, re.M)
        return m.group(1) if m else None

    git, cuda, version = field("git_version"), field("cuda"), field("__version__")
    if not git or not cuda or not version:
        raise BuildError(
            f"{wheel.name}: torch/version.py names no git_version, cuda or __version__: "
            "it is not an official CUDA build"
        )
    local = version.partition("+")[2] or "cu" + cuda.replace(".", "")
    return WheelFacts(git, cuda, local, int(any("cxx11" in s for s in exported)))


@dataclass(frozen=True)
class CudaPin:
    name: str
    version: str
    filename: str
    sha256: str
    include: str
    library: str | None
    comment: str


def cuda_pins(
    requires: Sequence[str], cuda: str, python: str, cache: Path
) -> tuple[list[CudaPin], str]:
    """The runtime and crt header packages for the wheel's CUDA, and how they were found."""
    major = cuda.split(".")[0]
    reqs = [r.split(";")[0].strip() for r in requires]
    runtime = next((r for r in reqs if r.startswith(f"nvidia-cuda-runtime-cu{major}==")), None)
    toolkit = next((r for r in reqs if r.startswith("cuda-toolkit[")), None)
    if runtime is not None:  # CUDA 12: the runtime pinned by name, crt/ in nvcc's package
        rt = _one(resolve(runtime, python, deps=False), f"nvidia-cuda-runtime-cu{major}", runtime)
        rt = as_fetched(rt, python, cache)
        mm = ".".join(rt.version.split(".")[:2])
        nvcc_spec = f"nvidia-cuda-nvcc-cu{major}=={mm}.*"
        nv = _one(resolve(nvcc_spec, python, deps=False), f"nvidia-cuda-nvcc-cu{major}", nvcc_spec)
        nv = as_fetched(nv, python, cache)
        how = f"the runtime the wheel pins ({runtime}), crt/ from nvcc {mm}"
        return [
            CudaPin(rt.name, rt.version, rt.filename, rt.sha256, "nvidia/cuda_runtime/include",
                    f"nvidia/cuda_runtime/lib/libcudart.so.{major}", ""),
            CudaPin(nv.name, nv.version, nv.filename, nv.sha256, "nvidia/cuda_nvcc/include",
                    None, "  # crt/ headers included by cuda_runtime.h"),
        ], how  # fmt: skip
    if toolkit is not None:  # CUDA 13: one cuda-toolkit version names every package
        version = toolkit.split("==", 1)[1].strip()
        rt_spec, crt_spec = f"cuda-toolkit[cudart]=={version}", f"cuda-toolkit[crt]=={version}"
        rt = _one(resolve(rt_spec, python, deps=True), "nvidia-cuda-runtime", rt_spec)
        crt = _one(resolve(crt_spec, python, deps=True), "nvidia-cuda-crt", crt_spec)
        rt, crt = as_fetched(rt, python, cache), as_fetched(crt, python, cache)
        how = f"the versions the wheel's own dependency cuda-toolkit[cudart]=={version} resolves to"
        return [
            CudaPin(rt.name, rt.version, rt.filename, rt.sha256, f"nvidia/cu{major}/include",
                    f"nvidia/cu{major}/lib/libcudart.so.{major}", ""),
            CudaPin(crt.name, crt.version, crt.filename, crt.sha256, f"nvidia/cu{major}/include",
                    None, "  # crt/ headers included by cuda_runtime.h"),
        ], how  # fmt: skip
    raise BuildError(
        f"the wheel depends on no nvidia-cuda-runtime-cu{major} or cuda-toolkit package: "
        "it is not a CUDA build this command knows how to pin"
    )


def upstream_yaml(
    version: str,
    pins: Sequence[tuple[str, Resolved]],
    facts: WheelFacts,
    cuda: Sequence[CudaPin],
    how: str,
    sources: dict[str, str],
    gpu_verified: str | None,
) -> str:
    lines = [
        f"# Pins for building torch {version}+um (integration path: inject).",
        "# Everything the build reads from outside this repository is listed here with its sha256;",
        "# a file whose hash differs stops the build. Schema: build_scripts/matrix.py.",
        "#",
        "# The injection path needs no upstream C++ source: the engine of c10_overlay/ is built",
        "# as its own library (torch/lib/libtorch_um.so) against the official wheel's headers and",
        "# libraries, and the patch series here changes only Python files of the official wheel.",
        "schema: 1",
        f"torch_version: {version}",
        "integration: inject",
        "",
        "upstream:",
        f"  tag: v{version}",
        f"  # git_version of the official {version} wheels (torch/version.py)",
        f"  commit: {facts.git_version}",
        "  repository: https://github.com/pytorch/pytorch",
        "",
        "wheel:",
        f'  cuda: "{facts.cuda}"',
        f"  local_label: {facts.local_label}",
        f"  cxx11_abi: {facts.cxx11_abi}",
        "  files:",
    ]
    for py, pin in pins:
        lines += [f'    "{py}":', f"      filename: {pin.filename}", f"      sha256: {pin.sha256}"]
    lines += [
        "",
        "# CUDA headers (and libcudart to link against), from the registry, matching wheel.cuda:",
        f"# {how}.",
        "cuda_packages:",
    ]
    for c in cuda:
        lines += [
            f"  - name: {c.name}{c.comment}",
            f"    version: {c.version}",
            f"    filename: {c.filename}",
            f"    sha256: {c.sha256}",
            f"    include: {c.include}",
        ]
        if c.library:
            lines.append(f"    library: {c.library}")
    pythons = " and ".join(py for py, _ in pins)
    lines += [
        "",
        "# What the injection build adds to the wheel, and the official library it links against",
        "# (and whose RPATH it copies). The official libraries themselves stay untouched.",
        "overlay:",
        "  library: torch/lib/libtorch_um.so",
        "  soname: libtorch_um.so",
        "  link_library: torch/lib/libc10_cuda.so",
        "  needed_may_add: []",
        "  needed_may_drop: []",
        "",
        "# Files of the official wheel that the patch series changes (paths inside the wheel),",
        f"# with their sha256 in both pinned wheels (identical for {pythons}).",
        "sources:",
    ]
    lines += [f"  {path}: {digest}" for path, digest in sorted(sources.items())]
    if gpu_verified:
        lines += [
            "",
            "# A passed run of tests/gpu on a GPU host (the record); the default version is the",
            "# newest version that has one.",
            f"gpu_verified: {gpu_verified}",
        ]
    return "\n".join(lines) + "\n"


def nearest_inject_version(version: str, root: Path) -> str:
    key = matrix._version_key
    others = [
        v
        for v in matrix.supported_versions(root)
        if v != version and matrix.load(v, root).integration == "inject"
    ]
    if not others:
        raise BuildError(f"no injection-path version under {root} to port the series from")
    older = [v for v in others if key(v) < key(version)]
    return older[-1] if older else others[0]


def patched_paths(series_dir: Path) -> list[str]:
    """Files the series' patches change (their ``+++ b/`` lines), in order."""
    out: list[str] = []
    for name in series.read_series(series_dir / "series"):
        for line in (series_dir / name).read_text().splitlines():
            if line.startswith("+++ b/"):
                path = line[len("+++ b/") :]
                if path not in out:
                    out.append(path)
    return out


def add(
    version: str,
    *,
    root: Path,
    cache: Path,
    base: str | None = None,
    dest: Path | None = None,
) -> Path:
    """Write ``dest`` (default ``root/version``): upstream.yaml, series and patches."""
    if not _VERSION.match(version):
        raise BuildError(f"{version!r} is not a release version X.Y.Z")
    base = base or nearest_inject_version(version, root)
    prev = matrix.load(base, root)
    if prev.integration != "inject":
        raise BuildError(f"--from {base}: it takes the {prev.integration!r} path, not 'inject'")
    dest = dest or root / version
    existing = root / version / "upstream.yaml"
    gpu = matrix.load(version, root).gpu_verified if existing.is_file() else None
    progress.step(f"torch {version}: porting the injection path of {base}")

    # 1-2. The official wheels, exactly this version, with CUDA dependencies.
    pins: list[tuple[str, Resolved]] = []
    wheels: dict[str, Path] = {}
    for py in (p.python for p in prev.wheel.files):
        spec = f"torch==={version}"
        found = _one(resolve(spec, py, deps=False), "torch", spec)
        if not any(r.startswith(("nvidia-", "cuda-")) for r in found.requires):
            raise BuildError(
                f"the index serves torch {version} for Python {py} only as {found.filename}, "
                "which has no CUDA dependencies: a CPU build cannot become a +um wheel"
            )
        parsed = wheelname.parse(found.filename)
        wheels[py] = fetch.pip_download(
            spec, found.filename, found.sha256, cache / "wheels",
            python_version=py, platform=parsed.platform, abi=parsed.abi,
        )  # fmt: skip
        pins.append((py, found))
    first = pins[0][0]
    facts = wheel_facts(wheels[first])
    cuda, how = cuda_pins(pins[0][1].requires, facts.cuda, first, cache)

    # 4. The series, ported onto the new wheel's files.
    paths = patched_paths(prev.directory)
    sources: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="um-version-add-") as tmp:
        new_tree = Path(tmp) / "new"
        for py, wheel in wheels.items():
            with zipfile.ZipFile(wheel) as zf:
                for path in paths:
                    try:
                        data = zf.read(path)
                    except KeyError:
                        raise BuildError(
                            f"{wheel.name} has no {path}, which the series patches"
                        ) from None
                    out = (new_tree if py == first else Path(tmp) / py) / path
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(data)
                    digest = sha256_file(out)
                    if sources.setdefault(path, digest) != digest:
                        raise BuildError(
                            f"{path} differs between the Python {first} and {py} wheels of "
                            f"torch {version}: one series cannot patch both"
                        )
        with atomic_dir(dest) as work:
            series_text = (prev.directory / "series").read_text().replace(
                f"torch {base} wheels", f"torch {version} wheels"
            )
            (work / "series").write_text(series_text)
            for name in series.read_series(prev.directory / "series"):
                shutil.copyfile(prev.directory / name, work / name)
            problem = _port_series(work, new_tree, prev, paths, cache)
            (work / "upstream.yaml").write_text(
                upstream_yaml(version, pins, facts, cuda, how, sources, gpu)
            )
    if problem:
        raise BuildError(
            f"{problem}. {dest} is written with the {base} patches as they are: port them "
            f"by hand, then `python -m build_scripts series refresh --torch-version {version}`"
        )
    progress.step(f"wrote {dest}")
    return dest


def _port_series(
    work: Path,
    new_tree: Path,
    prev: matrix.VersionMatrix,
    paths: list[str],
    cache: Path,
) -> str | None:
    """Port the copied series in ``work`` onto ``new_tree``; a problem, or None."""
    names = series.read_series(work / "series")
    probe = new_tree.parent / "probe"
    shutil.copytree(new_tree, probe)
    try:
        series.apply_series(work, names, probe, strict=True)
        return None  # applies as it is: the patches are copied byte for byte
    except BuildError:
        pass
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    # Offsets only (no fuzz: a fuzzy match can put a hunk in the wrong place): then the
    # patches get fresh context; otherwise a person ports them.
    shutil.copytree(new_tree, probe)
    try:
        series.apply_series(work, names, probe)
    except BuildError as exc:
        _print_upstream_diff(prev, new_tree, paths, cache)
        return (
            f"the {prev.torch_version} series does not apply to the new wheel's files with "
            f"no fuzz ({exc}); the difference between the two versions' files is above"
        )
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    changed = series.refresh(work / "series", new_tree)
    progress.step(f"applied at an offset, refreshed with fresh context: {', '.join(changed)}")
    return None


def _print_upstream_diff(
    prev: matrix.VersionMatrix, new_tree: Path, paths: list[str], cache: Path
) -> None:
    from build_scripts import official

    inputs = official.fetch_inputs(prev, prev.wheel.files[0].python, cache)
    base = official.wheel_files(prev, inputs, prev.sources, cache)
    for path in paths:
        old = (base / path).read_text().splitlines(keepends=True)
        new = (new_tree / path).read_text().splitlines(keepends=True)
        diff = list(
            difflib.unified_diff(old, new, f"{prev.torch_version}/{path}", f"new/{path}", n=2)
        )
        sys.stderr.writelines(diff[:_DIFF_LINES])
        if len(diff) > _DIFF_LINES:
            sys.stderr.write(f"... {len(diff) - _DIFF_LINES} more lines of difference in {path}\n")
