"""Downloads of pinned files and pip configuration outside the project (issue 56, part 2):
a version cap or constraints file does not stop them, the package index the user configured
(pip.conf or PIP_* variables) is the one asked, and a refused download ends in one line
naming the file and what to do. The real pip runs here against a local find-links folder
with ``no-index``: no network."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from build_scripts import fetch, pipconf, version_add
from build_scripts.errors import BuildError

from .helpers import sha

NAME = "umpinned"


def make_wheel(folder: Path, name: str = NAME, version: str = "1.0") -> Path:
    """A minimal pure-Python wheel that pip can resolve and download."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    di = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{di}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(
            f"{di}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{di}/RECORD", "")
    return wheel


@pytest.fixture
def capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's pip configuration: a constraints file that caps the package below the
    pinned version, and no index but a find-links folder (returned) that holds the file.
    The machine's user configuration is kept out; its global one may add more."""
    links = tmp_path / "links"
    make_wheel(links)
    cap = tmp_path / "cap.txt"
    cap.write_text(f"{NAME}<1.0\n")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nconstraint = {cap}\nno-index = true\n")
    for var in list(os.environ):
        if var.startswith("PIP_") and var not in ("PIP_CERT",):
            monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return links


def download(dest: Path, name: str = NAME, data: bytes | None = None) -> Path:
    filename = f"{name}-1.0-py3-none-any.whl"
    return fetch.pip_download(
        f"{name}===1.0",
        filename,
        sha(data) if data is not None else "0" * 64,
        dest,
        python_version="3.11",
        platform="any",
    )


def test_the_env_lifts_constraints_and_keeps_the_index_configuration() -> None:
    base = {
        "PIP_CONSTRAINT": "/etc/site/cap.txt",
        "PIP_INDEX_URL": "https://mirror.invalid/simple",
        "PIP_EXTRA_INDEX_URL": "https://extra.invalid/simple",
        "PIP_FIND_LINKS": "/srv/wheels",
        "PIP_NO_INDEX": "0",
        "PIP_CONFIG_FILE": "/home/u/pip.conf",
        "PIP_CERT": "/etc/ca.pem",
        "PATH": "/usr/bin",
    }
    env = pipconf.pinned_download_env(base)
    assert env["PIP_CONSTRAINT"] == os.devnull
    assert {k: v for k, v in env.items() if k != "PIP_CONSTRAINT"} == {
        k: v for k, v in base.items() if k != "PIP_CONSTRAINT"
    }
    assert base["PIP_CONSTRAINT"] == "/etc/site/cap.txt"  # the caller's mapping is not changed
    assert pipconf.pinned_download_env({})["PIP_CONSTRAINT"] == os.devnull


def test_a_cap_in_the_users_pip_config_does_not_stop_a_pinned_download(
    capped: Path, tmp_path: Path
) -> None:
    data = (capped / f"{NAME}-1.0-py3-none-any.whl").read_bytes()
    plain = subprocess.run(  # what pip alone makes of that configuration
        [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(tmp_path), NAME],
        capture_output=True,
        text=True,
        check=False,
    )
    assert plain.returncode != 0 and "ERROR" in plain.stderr
    got = download(tmp_path / "cache", data=data)
    assert got.read_bytes() == data  # from the find-links folder the user configured


def test_find_links_from_the_users_config_file_is_honoured(
    capped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index settings of a pip.conf (not only PIP_* variables) are the ones used."""
    conf = Path(os.environ["PIP_CONFIG_FILE"])
    conf.write_text(conf.read_text() + f"find-links = {capped}\n")
    monkeypatch.delenv("PIP_FIND_LINKS")
    data = (capped / f"{NAME}-1.0-py3-none-any.whl").read_bytes()
    assert download(tmp_path / "cache", data=data).read_bytes() == data


def test_a_file_the_index_does_not_serve_is_one_line_naming_it(
    capped: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "cache"
    with pytest.raises(BuildError) as exc:
        download(dest, name="umabsent")
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(
        "cannot download umabsent-1.0-py3-none-any.whl (pip download umabsent===1.0): "
        "No matching distribution found for umabsent===1.0 (pip exit 1). "
    )
    assert "index-url, extra-index-url, find-links" in msg
    assert msg.endswith(
        f"or put the file into {dest} by hand (it is checked against its pinned sha256)"
    )
    assert "ERROR" not in capfd.readouterr().err  # pip's own lines are not printed too
    assert [p.name for p in dest.iterdir()] == []  # pip's temporary folder is gone


def test_a_configured_index_that_does_not_exist_is_not_replaced(
    capped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build never falls back to another index than the one configured."""
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(BuildError, match=r"^cannot download umpinned-1\.0-py3-none-any\.whl "):
        download(tmp_path / "cache")


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        (
            "Looking in links: /x\n"
            "ERROR: Could not find a version that satisfies the requirement torch===2.15.0 "
            "(from versions: 2.13.0, 2.14.1)\n"
            "ERROR: No matching distribution found for torch===2.15.0\n",
            "No matching distribution found for torch===2.15.0 (pip exit 1)",
        ),
        (
            "ERROR: Exception:\nTraceback ...\n"
            "ERROR: HTTP error 403 while getting https://mirror.invalid/t.whl\n",
            "HTTP error 403 while getting https://mirror.invalid/t.whl (pip exit 1)",
        ),
        ("WARNING: something\nconnection reset by peer\n", "connection reset by peer (pip exit 1)"),
        ("", "pip exited with status 1 and printed no reason"),
        (None, "pip exited with status 1 and printed no reason"),
    ],
)
def test_reason_is_pips_most_telling_line(stderr: str | None, reason: str) -> None:
    assert pipconf.reason(stderr, 1) == reason


def test_reason_is_short() -> None:
    got = pipconf.reason("ERROR: " + "x" * 1000 + "\n", 2)
    assert len(got) < 330 and got.endswith("... (pip exit 2)")


def test_version_add_resolves_past_a_cap_with_the_users_index(capped: Path) -> None:
    """``version add`` resolves the new version through the same environment: a cap in
    pip's configuration does not hide the version being added, the configured index
    serves it, and a version the index lacks is one line."""
    found = version_add.resolve(f"{NAME}===1.0", "3.11", deps=False)
    assert [(r.name, r.version, r.filename) for r in found] == [
        (NAME, "1.0", f"{NAME}-1.0-py3-none-any.whl")
    ]
    with pytest.raises(BuildError) as exc:
        version_add.resolve(f"{NAME}===2.0", "3.11", deps=False)
    assert str(exc.value) == (
        f"pip cannot resolve {NAME}===2.0 for Python 3.11 (No matching distribution found for "
        f"{NAME}===2.0 (pip exit 1)): check the version and that the package index your pip "
        "configuration names serves it"
    )
