"""What every built version must satisfy, one real build per version (shared with the
per-version modules through the session's ``build_wheel``)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from build_scripts import abi, c_api, cli, inject_path, integration, matrix, pipeline, repack
from build_scripts.changes import overlay_python_files
from build_scripts.paths import REPO_ROOT

from .conftest import (
    Build,
    check_make_build,
    check_platform_tag,
    check_warm_rerun,
    check_wheel_identity,
    official_wheel_for,
    wheel_difference,
)

pytestmark = pytest.mark.integration


class Version(NamedTuple):
    version: str
    git: str  # git_version of the official wheel
    cuda: str
    official_platform: str  # the official cp311 wheel's platform tag


M228 = "manylinux_2_28_x86_64"
VERSIONS = [
    Version("2.6.0", "2236df1770800ffea5697b11b0bb0d910b2e59e1", "12.4", "manylinux1_x86_64"),
    Version("2.7.1", "e2d141dbde55c2a4370fac5165b0561b6af4798b", "12.6", M228),
    Version("2.8.0", "a1cb3cc05d46d198467bebbb6e8fba50a325d4e7", "12.8", M228),
    Version("2.9.1", "5811a8d7da873dd699ff6687092c225caffcf1bb", "12.8", M228),
    Version("2.10.0", "449b1768410104d3ed79d3bcfe4ba1d65c7f22c0", "12.8", M228),
    Version("2.11.0", "70d99e998b4955e0049d13a98d77ae1b14db1f45", "13.0", M228),
    Version("2.12.1", "7269437d655783a26cba32aa88195b741ff496aa", "13.0", M228),
    Version("2.13.0", "cf30153c4c131c8164ee7798e5022d810682e2cb", "13.0", M228),
    Version("2.14.1", "5c4886908584029761b579af026dcfb627c84070", "13.0", M228),
    Version("2.15.0", "d0f2af8b66b20da4baa50644c0cd3f887a2eae2e", "13.2", M228),
]


@pytest.fixture(scope="module", params=VERSIONS, ids=[v.version for v in VERSIONS])
def case(
    request: pytest.FixtureRequest, build_wheel: Build
) -> tuple[Version, pipeline.BuildResult]:
    v: Version = request.param
    return v, build_wheel(v.version)


def test_every_supported_version_is_covered() -> None:
    assert sorted(v.version for v in VERSIONS) == sorted(matrix.supported_versions())


def test_make_build_builds_the_default_version(build_wheel: Build) -> None:
    """No TORCH_VERSION: ``make build`` builds the newest version verified on a GPU host."""
    check_make_build(build_wheel(matrix.default_version()))


def test_wheel_name_version_and_tags(case: tuple[Version, pipeline.BuildResult]) -> None:
    v, built = case
    check_wheel_identity(built, v.version, v.git, v.cuda)


def test_platform_tag_is_honest(case: tuple[Version, pipeline.BuildResult]) -> None:
    v, built = case
    check_platform_tag(built, v.official_platform)


def test_record_is_valid(case: tuple[Version, pipeline.BuildResult]) -> None:
    _, built = case
    repack.validate(built.wheel)


def test_warm_rerun_reuses_everything(case: tuple[Version, pipeline.BuildResult]) -> None:
    v, built = case
    check_warm_rerun(built, v.version)


@pytest.mark.parametrize("version", [v.version for v in VERSIONS])
def test_series_check_applies_cleanly(version: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m build_scripts series check``: every patch applies with no fuzz or offset
    to the pinned files, and each one names the files it touches."""
    assert cli.main(["series", "check", "--torch-version", version]) == 0
    out = capsys.readouterr().out
    names = [
        n
        for n in matrix.load(version).series_file.read_text().splitlines()
        if n.strip() and not n.startswith("#")
    ]
    assert f"{len(names)} patch(es) apply cleanly to v{version} with no fuzz or offset" in out
    for name in names:
        assert f"ok   {name} (" in out


def test_only_what_the_path_changes_differs_from_the_official_wheel(
    case: tuple[Version, pipeline.BuildResult],
) -> None:
    """The integration path's own account of what it replaces and adds (WheelEdit), plus
    torch/cuda/um.py and torch/version.py, is the whole difference."""
    v, built = case
    m = matrix.load(v.version)
    edit = integration.for_version(m).wheel_edit(m)
    added, changed = wheel_difference(official_wheel_for(v.version), built.wheel)
    overlay_added = set(overlay_python_files(REPO_ROOT / "c10_overlay"))
    assert added == {*edit.added, *overlay_added}
    assert changed == {*edit.replaced, "torch/version.py"}


def test_engine_library_interposes_in_the_wheels_cuda_runtime(
    case: tuple[Version, pipeline.BuildResult],
) -> None:
    """Injection path: cudaMalloc & co. in libcudart.so.<the wheel's CUDA major>'s version
    node, and every C API function the headers declare."""
    v, built = case
    if matrix.load(v.version).integration != "inject":
        pytest.skip("source path: its ABI gate is checked in test_build_2_6_0.py")
    cudart = f"libcudart.so.{v.cuda.split('.')[0]}"
    elf = abi.read_elf(built.rebuilt_library)
    assert cudart in elf.needed
    versions = abi.exported_versions(built.rebuilt_library)
    assert {versions.get(n) for n in inject_path.INTERPOSED} == {cudart}
    official = abi.read_elf(built.official_library)
    inject_path.check_gate(elf, "libtorch_um.so", official.rpath, cudart, c_api.function_names())
