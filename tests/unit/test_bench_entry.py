"""bench/__main__.py, the benchmarks' one entry point, and the shape of bench/."""

from __future__ import annotations

import runpy
import subprocess
import sys

import pytest

from bench import __main__ as entry
from build_scripts.paths import REPO_ROOT

BENCH = REPO_ROOT / "bench"


def test_listing_names_every_benchmark_and_probe() -> None:
    text = entry.listing()
    for name in (*entry.BENCHMARKS, *entry.probes()):
        assert f"  {name} " in text
    assert "populate_probe" in entry.probes() and "evict_routes" in entry.probes()
    assert entry.module_of("residency") == "bench.residency"
    assert entry.module_of("copy_routes_probe") == "bench.probes.copy_routes_probe"
    assert entry.module_of("common") is None and entry.module_of("nope") is None


def test_python_m_bench_lists_and_refuses_an_unknown_name() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0 and "step_time" in run.stdout and "timeline_probe" in run.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "bench", "nope"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown benchmark or probe 'nope'" in bad.stderr


def test_bench_runs_a_module_by_name_with_its_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, object] = {}

    def fake_run_module(module: str, run_name: str, alter_sys: bool) -> None:
        seen.update(module=module, argv=list(sys.argv), run_name=run_name)

    monkeypatch.setattr(runpy, "run_module", fake_run_module)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert entry.main(["step_time", "--rounds", "2"]) == 0
    assert seen["module"] == "bench.step_time" and seen["run_name"] == "__main__"
    assert seen["argv"] == ["python -m bench.step_time", "--rounds", "2"]


def test_bench_keeps_ten_top_level_modules_and_the_probes_apart() -> None:
    top = sorted(p.stem for p in BENCH.glob("*.py"))
    assert len(top) <= 10, top
    for name in ("residency", "host_memory", "oversubscribe", "step_time", "common", "__main__"):
        assert name in top
    assert not [p.name for p in BENCH.glob("*") if p.suffix in (".cu", ".cpp")]
    assert not [n for n in top if n.endswith("_probe")]
    assert (BENCH / "probes" / "__init__.py").is_file()
