"""What every built version must satisfy, one real build per version (shared with the
per-version modules through the session's ``build_wheel``)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from build_scripts import cli, matrix, pipeline, repack

from .conftest import Build, check_platform_tag, check_warm_rerun, check_wheel_identity

pytestmark = pytest.mark.integration


class Version(NamedTuple):
    version: str
    git: str  # git_version of the official wheel
    cuda: str
    official_platform: str  # the official cp311 wheel's platform tag


VERSIONS = [
    Version("2.6.0", "2236df1770800ffea5697b11b0bb0d910b2e59e1", "12.4", "manylinux1_x86_64"),
    Version("2.11.0", "70d99e998b4955e0049d13a98d77ae1b14db1f45", "13.0", "manylinux_2_28_x86_64"),
]


@pytest.fixture(scope="module", params=VERSIONS, ids=[v.version for v in VERSIONS])
def case(
    request: pytest.FixtureRequest, build_wheel: Build
) -> tuple[Version, pipeline.BuildResult]:
    v: Version = request.param
    return v, build_wheel(v.version)


def test_every_supported_version_is_covered() -> None:
    assert sorted(v.version for v in VERSIONS) == sorted(matrix.supported_versions())


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
