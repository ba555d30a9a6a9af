"""When the engine turns on torch's page-locked buffers by registration (Note [Page-locked
buffers by registration], torch/cuda/_um_pinned.py): from torch 2.8, unless the program
chose a route, with the program's own settings kept; once per process."""

from __future__ import annotations

import pytest

from .helpers import load_overlay_module

ROUTE = "pinned_use_cuda_host_register:True,pinned_num_register_threads:"


@pytest.fixture
def pinned():  # type: ignore[no-untyped-def]
    return load_overlay_module("torch/cuda/_um_pinned.py", "um_pinned_under_test")


@pytest.mark.parametrize("version", ["2.6.0", "2.7.1+um", "garbage"])
def test_torch_before_2_8_keeps_cudahostalloc(pinned, version: str) -> None:  # type: ignore[no-untyped-def]
    settings, why = pinned.registration_settings(version, {}, 16)
    assert settings is None and "2.8" in why


@pytest.mark.parametrize(
    ("cpus", "threads"), [(1, 1), (2, 2), (6, 4), (16, 16), (128, 16)]
)
def test_threads_are_a_power_of_two_up_to_16(pinned, cpus: int, threads: int) -> None:  # type: ignore[no-untyped-def]
    settings, _ = pinned.registration_settings("2.11.0+um", {}, cpus)
    assert settings == f"{ROUTE}{threads}"


def test_the_programs_own_settings_are_kept_in_front(pinned) -> None:  # type: ignore[no-untyped-def]
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256,garbage_collection_threshold:0.8,"}
    settings, _ = pinned.registration_settings("2.8.0", env, 16)
    assert settings == f"max_split_size_mb:256,garbage_collection_threshold:0.8,{ROUTE}16"


@pytest.mark.parametrize("var", ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
def test_expandable_segments_dropped_by_um_are_not_set_again(pinned, var: str) -> None:  # type: ignore[no-untyped-def]
    """UM drops expandable_segments:True (um.py, _drop_expandable_segments); the route's
    settings, the program's own with two keys appended, must not turn it back on."""
    env = {var: "expandable_segments:True,max_split_size_mb:256"}
    settings, _ = pinned.registration_settings("2.15.0", env, 16)
    assert settings == f"max_split_size_mb:256,{ROUTE}16"
    settings, _ = pinned.registration_settings("2.15.0", {var: "expandable_segments:True"}, 16)
    assert settings == f"{ROUTE}16"


@pytest.mark.parametrize(
    ("version", "env", "name", "expandable"),
    [
        ("2.15.0", {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "PYTORCH_ALLOC_CONF", "True"),
        ("2.15.0", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
         "PYTORCH_CUDA_ALLOC_CONF", "True"),
        ("2.11.0", {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "PYTORCH_ALLOC_CONF", "True"),
        # the variable read first wins whole: the other is not read once it is set
        ("2.15.0", {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64",
                    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
         "PYTORCH_ALLOC_CONF", None),
        ("2.11.0", {"PYTORCH_ALLOC_CONF": "expandable_segments:True",
                    "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"},
         "PYTORCH_CUDA_ALLOC_CONF", None),
        # set but empty is set: torch reads it (and nothing else)
        ("2.15.0", {"PYTORCH_ALLOC_CONF": "", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
         "PYTORCH_ALLOC_CONF", None),
        # before 2.9 only PYTORCH_CUDA_ALLOC_CONF is read
        ("2.8.0", {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, None, None),
        # the last value given is the one torch applies
        ("2.11.0", {"PYTORCH_ALLOC_CONF": "expandable_segments:True, expandable_segments:False"},
         "PYTORCH_ALLOC_CONF", "False"),
    ],
)
def test_the_settings_torch_reads(pinned, version: str, env: dict[str, str], name: str | None,  # type: ignore[no-untyped-def]
                                  expandable: str | None) -> None:
    got_name, text = pinned.program_settings(version, env)
    assert got_name == name
    assert pinned.setting(text, "expandable_segments") == expandable


@pytest.mark.parametrize(
    "conf",
    [
        "pinned_use_cuda_host_register:False",
        "expandable_segments:True, pinned_num_register_threads:4",
        "pinned_use_hip_host_register:True",
    ],
)
def test_a_route_the_program_chose_stands(pinned, conf: str) -> None:  # type: ignore[no-untyped-def]
    settings, why = pinned.registration_settings("2.11.0", {"PYTORCH_CUDA_ALLOC_CONF": conf}, 16)
    assert settings is None and "PYTORCH_CUDA_ALLOC_CONF" in why


def test_the_variable_torch_reads_wins_whole(pinned) -> None:  # type: ignore[no-untyped-def]
    """Note [Which variable torch reads its allocator settings from]."""
    env = {
        "PYTORCH_ALLOC_CONF": "pinned_use_cuda_host_register:False",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128",
    }
    # 2.15 reads PYTORCH_ALLOC_CONF first: the program's choice stands
    settings, why = pinned.registration_settings("2.15.0", env, 16)
    assert settings is None and "PYTORCH_ALLOC_CONF" in why
    # 2.9 to 2.14 read PYTORCH_CUDA_ALLOC_CONF first, and 2.8 only that one: its settings are
    # carried (expandable_segments excepted: UM dropped it)
    for version in ("2.8.0", "2.11.0", "2.14.1"):
        settings, _ = pinned.registration_settings(version, env, 16)
        assert settings == f"max_split_size_mb:128,{ROUTE}16", version
    # from 2.9, PYTORCH_ALLOC_CONF alone is read too
    only = {"PYTORCH_ALLOC_CONF": "pinned_num_register_threads:4"}
    assert pinned.registration_settings("2.11.0", only, 16)[0] is None
    assert pinned.registration_settings("2.8.0", only, 16)[0] == f"{ROUTE}16"


def test_applied_once_per_process_and_a_refusal_keeps_the_default(pinned) -> None:  # type: ignore[no-untyped-def]
    calls: list[str] = []
    assert pinned.prefer_registration("2.11.0", calls.append, {})[0] is True
    assert pinned.prefer_registration("2.11.0", calls.append, {})[0] is True
    assert len(calls) == 1 and calls[0].startswith(ROUTE)

    fresh = load_overlay_module("torch/cuda/_um_pinned.py", "um_pinned_refused")

    def refuse(settings: str) -> None:
        raise RuntimeError("Unrecognized key 'pinned_use_cuda_host_register'")

    on, why = fresh.prefer_registration("2.11.0", refuse, {})
    assert on is False and "Unrecognized key" in why
    assert fresh.prefer_registration("2.11.0", calls.append, {})[0] is False  # decided
    assert len(calls) == 1
