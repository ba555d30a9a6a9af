from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from build_scripts import fetch
from build_scripts.errors import BuildError

from .helpers import sha


def test_cached_url_fetches_file_urls_and_reuses_cache(tmp_path: Path) -> None:
    src = tmp_path / "served" / "x.tar.xz"
    src.parent.mkdir()
    src.write_bytes(b"payload")
    dest = tmp_path / "cache" / "x.tar.xz"
    assert fetch.cached_url(src.as_uri(), dest, sha(b"payload")).read_bytes() == b"payload"
    src.unlink()  # a second call must not need the server
    assert fetch.cached_url(src.as_uri(), dest, sha(b"payload")) == dest


def test_cached_url_rejects_and_removes_a_bad_download(tmp_path: Path) -> None:
    src = tmp_path / "x.bin"
    src.write_bytes(b"tampered")
    dest = tmp_path / "cache" / "x.bin"
    with pytest.raises(BuildError) as exc:
        fetch.cached_url(src.as_uri(), dest, "2" * 64)
    assert (
        "x.bin" in str(exc.value)
        and "2" * 64 in str(exc.value)
        and sha(b"tampered") in str(exc.value)
    )
    assert not dest.exists()


def test_unreachable_url_is_a_fetch_error(tmp_path: Path) -> None:
    with pytest.raises(fetch.FetchError):
        fetch.urllib_fetch((tmp_path / "missing").as_uri(), tmp_path / "out", 1.0)
    assert not (tmp_path / "out").exists()


def _fake_pip(produce: bytes | None, rc: int = 0) -> Any:
    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        assert cmd[1:4] == ["-m", "pip", "download"]
        assert "--no-deps" in cmd and "--only-binary=:all:" in cmd
        dest = Path(cmd[cmd.index("--dest") + 1])
        if produce is not None:
            (dest / "pkg-1.0-py3-none-any.whl").write_bytes(produce)
        return subprocess.CompletedProcess(cmd, rc)

    return run


def test_pip_download_verifies_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "run", _fake_pip(b"wheel-bytes"))
    got = fetch.pip_download(
        "pkg==1.0",
        "pkg-1.0-py3-none-any.whl",
        sha(b"wheel-bytes"),
        tmp_path,
        python_version="3.11",
        platform="any",
    )
    assert got.read_bytes() == b"wheel-bytes"
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [got.name]


def test_pip_download_hash_mismatch_names_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subprocess, "run", _fake_pip(b"evil"))
    with pytest.raises(BuildError) as exc:
        fetch.pip_download(
            "pkg==1.0",
            "pkg-1.0-py3-none-any.whl",
            "3" * 64,
            tmp_path,
            python_version="3.11",
            platform="any",
        )
    msg = str(exc.value)
    assert "pkg-1.0-py3-none-any.whl" in msg and "3" * 64 in msg and sha(b"evil") in msg
    assert not (tmp_path / "pkg-1.0-py3-none-any.whl").exists()


def test_pip_download_failure_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subprocess, "run", _fake_pip(None, rc=1))
    with pytest.raises(
        BuildError,
        match=r"^cannot download pkg-1.0-py3-none-any.whl \(pip download pkg==1.0\): pip exited "
        r"with status 1 and printed no reason\. .* or put the file into .* by hand",
    ):
        fetch.pip_download(
            "pkg==1.0",
            "pkg-1.0-py3-none-any.whl",
            "3" * 64,
            tmp_path,
            python_version="3.11",
            platform="any",
        )


def test_pip_download_uses_cached_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pkg-1.0-py3-none-any.whl").write_bytes(b"cached")

    def no_run(*a: object, **k: object) -> None:
        raise AssertionError("pip must not run")

    monkeypatch.setattr(subprocess, "run", no_run)
    got = fetch.pip_download(
        "pkg==1.0",
        "pkg-1.0-py3-none-any.whl",
        sha(b"cached"),
        tmp_path,
        python_version="3.11",
        platform="any",
    )
    assert got == tmp_path / "pkg-1.0-py3-none-any.whl"


def test_pip_download_lifts_constraints_and_keeps_the_users_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pinned download runs pip with the caller's environment (its index settings), and
    with pip's constraints lifted: a site's cap on versions does not refuse a pinned file."""
    seen: dict[str, str] = {}
    fake = _fake_pip(b"wheel-bytes")

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        seen.update(kwargs["env"])
        return fake(cmd, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/site/cap.txt")
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.invalid/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/srv/wheels")
    monkeypatch.setattr(subprocess, "run", run)
    fetch.pip_download(
        "pkg==1.0",
        "pkg-1.0-py3-none-any.whl",
        sha(b"wheel-bytes"),
        tmp_path,
        python_version="3.11",
        platform="any",
    )
    assert seen["PIP_CONSTRAINT"] == os.devnull
    assert seen["PIP_INDEX_URL"] == "https://mirror.invalid/simple"
    assert seen["PIP_FIND_LINKS"] == "/srv/wheels"
