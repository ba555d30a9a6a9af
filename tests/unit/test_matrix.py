from __future__ import annotations

import subprocess
from pathlib import Path
from typing import get_args

import pytest

from build_scripts import inject_path, integration, matrix, official, pipeline, source_path
from build_scripts.errors import BuildError
from build_scripts.paths import REPO_ROOT

from .helpers import matrix_doc, write_matrix


def test_real_2_6_0_pins() -> None:
    m = matrix.load("2.6.0")
    assert m.integration == "source"
    assert m.upstream.commit == "2236df1770800ffea5697b11b0bb0d910b2e59e1"
    assert m.upstream.tag == "v2.6.0"
    assert m.wheel.cuda == "12.4" and m.wheel.cxx11_abi == 0
    cp311 = m.wheel.for_python("3.11")
    assert cp311.filename == "torch-2.6.0-cp311-cp311-manylinux1_x86_64.whl"
    assert cp311.sha256 == "7979834102cd5b7a43cc64e87f2f3b14bd0e1458f06e9f88ffa386d07c7446e1"
    assert cp311.platform == "manylinux1_x86_64" and cp311.cp_tag == "cp311"
    assert m.wheel.for_python("3.12").filename.startswith("torch-2.6.0-cp312-cp312-")
    assert m.debian is not None and m.debian.version == "2.6.0+dfsg-7"
    assert m.debian.top_dir == "pytorch-v2.6.0"
    names = {p.name for p in m.cuda_packages}
    assert {"nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12", "nvidia-nvml-dev-cu12"} <= names
    paths = {f.path for f in m.sources}
    assert "c10/cuda/CUDACachingAllocator.cpp" in paths
    assert not any("/test/" in p or p.endswith((".bzl", "BUILD.bazel", "README.md")) for p in paths)
    assert m.um_version == "2.6.0+um"


def test_supported_versions_are_directories_with_upstream_yaml(tmp_path: Path) -> None:
    write_matrix(tmp_path, matrix_doc("9.1.0"))
    write_matrix(tmp_path, matrix_doc("9.10.0"))
    (tmp_path / "9.2.0").mkdir()  # no upstream.yaml: not supported
    assert matrix.supported_versions(tmp_path) == ["9.1.0", "9.10.0"]
    assert "2.6.0" in matrix.supported_versions()


def test_unknown_version_lists_supported(tmp_path: Path) -> None:
    write_matrix(tmp_path, matrix_doc("9.1.0"))
    with pytest.raises(BuildError) as exc:
        matrix.load("1.2.3", tmp_path)
    assert str(exc.value).startswith("unknown TORCH_VERSION '1.2.3': supported versions are 9.1.0")


def test_unknown_python_names_the_available_ones() -> None:
    m = matrix.load("2.6.0")
    with pytest.raises(
        BuildError, match=r"no official wheel pinned for Python 3\.9; .*3\.11, 3\.12"
    ):
        m.wheel.for_python("3.9")


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"schema": 2}, "schema 2 is not supported"),
        ({"integration": "magic"}, "integration must be 'source' or 'inject'"),
        (
            {"upstream": {"tag": "v", "commit": "xyz", "repository": "r"}},
            "upstream.commit 'xyz' is malformed",
        ),
        (
            {"sources": {"c10/cuda/A.cpp": "beef"}},
            "sources.c10/cuda/A.cpp sha256 'beef' is malformed",
        ),
        ({"sources": {"../etc/passwd": "0" * 64}}, "must be a relative path"),
        ({"sources": {}}, "integration 'source' needs a non-empty 'sources' map"),
        ({"overlay": {"soname": "x"}}, "missing key overlay.library"),
    ],
)
def test_bad_documents_name_the_key(tmp_path: Path, patch: dict[str, object], message: str) -> None:
    write_matrix(tmp_path, matrix_doc("9.1.0", **patch))
    with pytest.raises(BuildError, match="upstream.yaml: ") as exc:
        matrix.load("9.1.0", tmp_path)
    assert message in str(exc.value)


def test_version_must_match_directory(tmp_path: Path) -> None:
    d = write_matrix(tmp_path, matrix_doc("9.1.0"))
    d.rename(tmp_path / "9.1.1")
    with pytest.raises(BuildError, match="does not match its directory '9.1.1'"):
        matrix.load("9.1.1", tmp_path)


def test_invalid_yaml(tmp_path: Path) -> None:
    (tmp_path / "9.1.0").mkdir()
    (tmp_path / "9.1.0" / "upstream.yaml").write_text("a: [b\n")
    with pytest.raises(BuildError, match="is not valid YAML"):
        matrix.load("9.1.0", tmp_path)


class _PathChosen(Exception):
    pass


@pytest.mark.parametrize("integration", ["source", "inject"])
def test_pipeline_dispatches_to_the_integration_path(
    integration: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_matrix(tmp_path / "patches", matrix_doc("9.1.0", integration=integration))
    fetched = object()
    seen: list[tuple[str, str, object]] = []

    def fake_fetch(m: matrix.VersionMatrix, python: str, cache: Path) -> object:
        return fetched

    def recorder(name: str) -> object:
        def fake_build(m: matrix.VersionMatrix, inputs: object, python: str, **kw: object) -> None:
            seen.append((name, m.integration, inputs))
            raise _PathChosen

        return fake_build

    monkeypatch.setattr(official, "fetch_inputs", fake_fetch)
    monkeypatch.setattr(source_path.SourcePath, "build", _method(recorder("source_path")))
    monkeypatch.setattr(inject_path.InjectPath, "build", _method(recorder("inject_path")))
    with pytest.raises(_PathChosen):
        pipeline.build("9.1.0", "3.11", repo=tmp_path, cache=tmp_path / "c")
    assert seen == [(f"{integration}_path", integration, fetched)]


def _method(fn: object) -> object:
    return lambda self, *a, **kw: fn(*a, **kw)  # type: ignore[operator]


def test_registry_names_every_integration_value_once() -> None:
    paths = integration.registry()
    assert set(paths) == set(get_args(matrix.Integration))
    assert all(name == p.name for name, p in paths.items())
    m = matrix.load("2.11.0")
    assert integration.for_version(m) is inject_path.PATH
    assert integration.for_version(matrix.load("2.6.0")) is source_path.PATH
    edit = inject_path.PATH.wheel_edit(m)
    assert edit.added == ("torch/lib/libtorch_um.so",)
    assert edit.replaced == ("torch/__init__.py", "torch/cuda/__init__.py")


def test_default_version_is_the_newest_gpu_verified_one(tmp_path: Path) -> None:
    """No version in the Makefile: ``versions --default`` decides, from gpu_verified."""
    lines = (REPO_ROOT / "Makefile").read_text().splitlines()
    defaults = [ln for ln in lines if ln.startswith("TORCH_VERSION ?=")]
    assert len(defaults) == 1 and "versions --default" in defaults[0]
    verified = [v for v in matrix.supported_versions() if matrix.load(v).gpu_verified]
    assert matrix.default_version() == verified[-1]
    for v in verified:
        assert (REPO_ROOT / str(matrix.load(v).gpu_verified)).is_file()
    # a newer version without a GPU record does not become the default
    root = tmp_path / "patches"
    (tmp_path / "rec.md").write_text("passed\n")
    write_matrix(root, {**matrix_doc("9.1.0"), "gpu_verified": "rec.md"})
    write_matrix(root, matrix_doc("9.2.0"))
    assert matrix.default_version(root) == "9.1.0"
    write_matrix(root, {**matrix_doc("9.3.0"), "gpu_verified": "missing.md"})
    with pytest.raises(BuildError, match="gpu_verified must name a GPU record"):
        matrix.load("9.3.0", root)


def test_the_default_version_is_computed_only_after_the_venv_exists(tmp_path: Path) -> None:
    """On a fresh clone .venv does not exist while make reads the Makefiles, and its Python
    computes the default version: reading them (docker/docker.mk included) must not expand
    TORCH_VERSION, or the default is '' for the whole run (issue 56). Here .venv's Python
    is a script that records each call and prints a version."""
    calls = tmp_path / "calls"
    vpy = tmp_path / "python"
    vpy.write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho 9.9.9\n')
    vpy.chmod(0o755)

    def make_n(target: str) -> str:
        proc = subprocess.run(
            ["make", "--no-print-directory", "-n", target, f"VPY={vpy}", "STAMP="],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    make_n("help")  # -n: only what reading the Makefiles runs
    assert not calls.exists()
    out = make_n("build")  # the recipe is expanded, after its prerequisite $(STAMP)
    assert f"{vpy} -m build_scripts build --torch-version='9.9.9'" in out
    assert calls.read_text().splitlines() == ["-m build_scripts versions --default"]


def test_ci_builds_the_default_with_no_arguments_before_anything_else() -> None:
    """.ci/run (CI, on a fresh clone) runs the README's first command, `make build` with no
    TORCH_VERSION, before `make test` has made .venv, and checks the wheel it built."""
    lines = [ln.strip() for ln in (REPO_ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [ln for ln in lines if ln and not ln.startswith("#")]
    build = next(i for i, ln in enumerate(commands) if ln.startswith("make ") and " build" in ln)
    assert "TORCH_VERSION" not in commands[build]
    assert not any(ln.startswith(("make", ".venv/bin")) for ln in commands[:build])
    after = commands[build:]
    assert any("build_scripts validate" in ln for ln in after)
    assert any("versions --default" in ln for ln in after)
    assert after.index("make test") > max(
        i for i, ln in enumerate(after) if "build_scripts validate" in ln
    )
