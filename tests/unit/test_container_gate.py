"""The container tests' disk gate: asked for by name they fail on a small disk, under
`.ci/run` (UM_CONTAINER_TESTS=auto) they are skipped with the same message."""

from __future__ import annotations

import shutil

import pytest

from tests.container import test_container_build as build

GiB = 2**30


def test_room_enough_says_nothing() -> None:
    assert build._short_of_space(build.NEEDED_GIB * GiB) is None


def test_small_disk_is_named_with_what_is_needed_and_found() -> None:
    why = build._short_of_space(int(3.5 * GiB))
    assert why is not None
    assert f"{build.NEEDED_GIB} GiB" in why and "found 3.5 GiB" in why
    assert "build/container/test" in why


@pytest.mark.parametrize(
    ("mode", "outcome"), [("1", pytest.fail.Exception), ("auto", pytest.skip.Exception)]
)
def test_small_disk_fails_by_name_and_skips_under_ci(
    mode: str, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _: _Usage(free=GiB))
    with pytest.raises(outcome, match="found 1.0 GiB"):
        build._check_free_space(mode)


def test_room_enough_runs_in_either_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _: _Usage(free=100 * GiB))
    for mode in ("1", "auto"):
        build._check_free_space(mode)  # neither skips nor fails


class _Usage:
    def __init__(self, free: int) -> None:
        self.free = free
