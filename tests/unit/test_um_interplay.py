"""Note [nccl2 registers every segment] (torch/cuda/_um_interplay.py): while UM is on, torch
2.15 and later use the legacy NCCL process group unless the program chose; a choice of
nccl2 is warned about, and older torch is left alone."""

from __future__ import annotations

import pytest

from .helpers import load_overlay_module


@pytest.fixture
def interplay():  # type: ignore[no-untyped-def]
    return load_overlay_module("torch/cuda/_um_interplay.py", "um_interplay_under_test")


def test_torch_2_15_uses_the_legacy_process_group_unless_told(interplay) -> None:  # type: ignore[no-untyped-def]
    assert interplay.nccl_process_group((2, 15), {}) == ("0", None)
    assert interplay.nccl_process_group((3, 0), {"OTHER": "1"}) == ("0", None)
    assert interplay.nccl_process_group((2, 15), {interplay.NCCL2: "0"}) == (None, None)


def test_a_program_that_chose_nccl2_keeps_it_and_is_warned(interplay) -> None:  # type: ignore[no-untyped-def]
    value, warning = interplay.nccl_process_group((2, 16), {interplay.NCCL2: "1"})
    assert value is None
    assert "TORCH_DIST_USE_NCCL2=1" in warning and "enabled:False" in warning


@pytest.mark.parametrize("version", [(2, 11), (2, 14)])
def test_older_torch_is_left_alone(interplay, version: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert interplay.nccl_process_group(version, {}) == (None, None)
    assert interplay.nccl_process_group(version, {interplay.NCCL2: "1"}) == (None, None)
