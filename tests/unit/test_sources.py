from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from build_scripts import matrix, sources
from build_scripts.errors import BuildError
from build_scripts.fetch import FetchError
from build_scripts.sources import debian
from build_scripts.sources.debian import DebianProvider
from build_scripts.sources.git import GitRawProvider, raw_url_base
from build_scripts.sources.local import LocalProvider

from .helpers import UPSTREAM_FILES, make_tarball, matrix_doc, sha, write_matrix, write_tree


def _matrix(tmp_path: Path, **debian_overrides: str) -> matrix.VersionMatrix:
    doc = matrix_doc("9.1.0")
    doc["debian"].update(debian_overrides)
    write_matrix(tmp_path / "patches", doc)
    return matrix.load("9.1.0", tmp_path / "patches")


def _unreachable(url: str, dest: Path, timeout: float) -> None:
    raise FetchError(f"{url}: Name or service not known")


def test_local_tree_and_nested_tree(tmp_path: Path, cache: Path) -> None:
    m = _matrix(tmp_path)
    tree = write_tree(tmp_path / "checkout" / "pytorch", UPSTREAM_FILES)
    for loc in (tree, tree.parent):  # the top, or a directory holding only the top
        got = sources.fetch_upstream(m, [LocalProvider(loc)], cache=tmp_path / f"c{loc.name}")
        assert (got / "c10/cuda/A.cpp").read_bytes() == UPSTREAM_FILES["c10/cuda/A.cpp"]


def test_local_tarball(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    tarball = make_tarball(tmp_path / "src.tar.gz", UPSTREAM_FILES, "pytorch-v9.1.0", "w:gz")
    got = sources.fetch_upstream(m, [LocalProvider(tarball)], cache=tmp_path / "cache")
    assert sorted(str(p.relative_to(got)) for p in got.rglob("*") if p.is_file()) == sorted(
        UPSTREAM_FILES
    )


def test_local_tree_with_wrong_file_is_refused_naming_it(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    tree = write_tree(tmp_path / "t", {**UPSTREAM_FILES, "c10/cuda/A.cpp": b"changed\n"})
    with pytest.raises(BuildError) as exc:
        sources.fetch_upstream(m, [LocalProvider(tree)], cache=tmp_path / "cache")
    msg = str(exc.value)
    assert "upstream file c10/cuda/A.cpp from TORCH_SRC=" in msg
    assert sha(b"changed\n") in msg and sha(UPSTREAM_FILES["c10/cuda/A.cpp"]) in msg
    assert not (tmp_path / "cache" / "upstream").exists() or not any(
        (tmp_path / "cache" / "upstream").iterdir()
    )


def test_local_missing_file(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    tree = write_tree(tmp_path / "t", {"c10/cuda/A.cpp": UPSTREAM_FILES["c10/cuda/A.cpp"]})
    with pytest.raises(BuildError, match="TORCH_SRC tree .* has no c10/cuda/impl/B.h"):
        sources.fetch_upstream(m, [LocalProvider(tree)], cache=tmp_path / "cache")


def test_git_provider_fetches_by_commit(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    urls: list[str] = []

    def fake(url: str, dest: Path, timeout: float) -> None:
        urls.append(url)
        assert timeout <= 10
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(UPSTREAM_FILES[url.split(m.upstream.commit + "/", 1)[1]])

    got = sources.fetch_upstream(m, [GitRawProvider(fetcher=fake)], cache=tmp_path / "cache")
    assert (got / "c10/cuda/impl/B.h").is_file()
    assert urls[0] == f"https://git.example/o/r/raw/{'a' * 40}/c10/cuda/A.cpp"
    assert raw_url_base("https://github.com/pytorch/pytorch.git", "c0ffee").endswith(
        "/pytorch/pytorch/c0ffee/"
    )


def _fake_archive(tmp_path: Path, m: matrix.VersionMatrix, tarball_bytes: bytes) -> Path:
    """A Debian archive in a local directory: dists/<suite>/main/source/Sources.xz + pool."""
    assert m.debian is not None
    archive = tmp_path / "archive"
    pool = archive / "pool/main/p/pytorch"
    pool.mkdir(parents=True)
    (pool / m.debian.orig_tarball).write_bytes(tarball_bytes)
    index = f"""Package: other
Version: 1.0-1
Directory: pool/main/o/other
Checksums-Sha256:
 {"4" * 64} 10 other_1.0.orig.tar.xz

Package: pytorch
Binary: python3-torch
Version: {m.debian.version}
Directory: pool/main/p/pytorch
Checksums-Sha256:
 {"5" * 64} 2000 pytorch_{m.debian.version}.dsc
 {sha(tarball_bytes)} {len(tarball_bytes)} {m.debian.orig_tarball}
"""
    src = archive / "dists" / m.debian.suite / "main" / "source"
    src.mkdir(parents=True)
    (src / "Sources.xz").write_bytes(lzma.compress(index.encode()))
    return archive


def _fake_apt(tmp_path: Path, archive_uri: str) -> Path:
    etc = tmp_path / "etc-apt"
    d = etc / "sources.list.d"
    d.mkdir(parents=True)
    (etc / "sources.list").write_text(
        "# one-line format\ndeb [arch=amd64] https://vendor.example/apt stable-vendor main\n"
    )
    (d / "debian.sources").write_text(
        "Types: deb\n"
        "# a comment inside a stanza\n"
        f"URIs: {archive_uri}\n"
        "Suites: bookworm bookworm-updates\n"
        "Components: main\n"
        "\n"
        "Types: deb\n"
        "URIs: http://security.example/debian-security\n"
        "Suites: bookworm-security\n"
        "Components: main\n"
        "\n"
        "Types: deb\n"
        "URIs: http://disabled.example/debian\n"
        "Suites: trixie\n"
        "Enabled: no\n"
    )
    (d / "third.list.disabled-by-admin").write_text("deb http://ignored.example/debian sid main\n")
    (d / "nodesource.sources").write_text(
        "Types: deb\nURIs: https://node.example/node_20.x\nSuites: nodistro\nComponents: main\n"
    )
    return etc


def test_apt_config_parsing_picks_the_debian_archive(tmp_path: Path) -> None:
    etc = _fake_apt(tmp_path, "http://mirror.example/debian")
    entries = debian.read_apt_config(etc)
    uris = {e.uri for e in entries}
    assert "http://disabled.example/debian" not in uris
    assert "http://ignored.example/debian" not in uris
    assert debian.debian_archive_uris(entries) == ["http://mirror.example/debian/"]


def test_one_line_sources_list(tmp_path: Path) -> None:
    text = "deb http://m.example/debian trixie main contrib\ndeb-src [ signed-by=/k.gpg ] http://m.example/debian sid main\n"
    entries = list(debian.parse_one_line(text, tmp_path / "sources.list"))
    assert [(e.uri, e.suites) for e in entries] == [
        ("http://m.example/debian", ("trixie",)),
        ("http://m.example/debian", ("sid",)),
    ]


def test_debian_provider_end_to_end_from_local_archive(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    assert m.debian is not None
    tarball = make_tarball(tmp_path / "orig.tar.xz", UPSTREAM_FILES, m.debian.top_dir).read_bytes()
    m = _matrix(tmp_path, sha256=sha(tarball))
    archive = _fake_archive(tmp_path, m, tarball)
    etc = _fake_apt(tmp_path, archive.as_uri())
    cache = tmp_path / "cache"
    providers: list[sources.Provider] = [
        GitRawProvider(fetcher=_unreachable),
        DebianProvider(cache_dir=cache, etc_apt=etc),
    ]
    got = sources.fetch_upstream(m, providers, cache=cache)
    assert (got / "c10/cuda/A.cpp").read_bytes() == UPSTREAM_FILES["c10/cuda/A.cpp"]
    assert m.debian is not None
    assert (cache / "src" / m.debian.orig_tarball).is_file()
    # warm: served from the cache, no provider consulted
    assert sources.fetch_upstream(m, [], cache=cache) == got


def test_debian_tarball_with_wrong_hash_is_refused(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    assert m.debian is not None
    tarball = make_tarball(tmp_path / "orig.tar.xz", UPSTREAM_FILES, m.debian.top_dir).read_bytes()
    archive = _fake_archive(tmp_path, m, tarball)  # pin says 000..., archive serves other bytes
    etc = _fake_apt(tmp_path, archive.as_uri())
    cache = tmp_path / "cache"
    with pytest.raises(BuildError) as exc:
        sources.fetch_upstream(m, [DebianProvider(cache_dir=cache, etc_apt=etc)], cache=cache)
    msg = str(exc.value)
    assert m.debian.orig_tarball in msg and "0" * 64 in msg and sha(tarball) in msg
    assert not (cache / "src" / m.debian.orig_tarball).exists()


def test_debian_newer_revision_with_same_orig_is_accepted(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    assert m.debian is not None
    rec = debian.SourceRecord(
        "pytorch", "9.1.0+dfsg-9", "pool/main/p/pytorch", {m.debian.orig_tarball: m.debian.sha256}
    )
    assert debian.find_orig(iter([rec]), m.debian) == rec
    other = debian.SourceRecord(
        "pytorch", "9.1.0+dfsg-9", "pool", {m.debian.orig_tarball: "6" * 64}
    )
    assert debian.find_orig(iter([other]), m.debian) is None


def test_no_provider_serves_lists_every_reason(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    etc = tmp_path / "empty-apt"
    etc.mkdir()
    with pytest.raises(BuildError) as exc:
        sources.fetch_upstream(
            m,
            [
                GitRawProvider(fetcher=_unreachable),
                DebianProvider(cache_dir=tmp_path / "c", etc_apt=etc),
            ],
            cache=tmp_path / "c",
        )
    msg = str(exc.value)
    assert "no source provider could serve the upstream files of torch 9.1.0" in msg
    assert (
        "Name or service not known" in msg and "no Debian archive in the apt configuration" in msg
    )
    assert "Set TORCH_SRC" in msg
    assert not (tmp_path / "c" / "upstream" / f"9.1.0-{'a' * 12}").exists()


def test_default_providers_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_SRC", str(tmp_path))
    monkeypatch.delenv("TORCH_UM_NO_GIT", raising=False)
    names = [p.name for p in sources.default_providers(tmp_path)]
    assert names[0].startswith("TORCH_SRC=") and names[1].startswith("upstream git")
    assert names[2] == "Debian source package"


def test_torch_src_that_is_not_a_tree_or_tarball(tmp_path: Path) -> None:
    m = _matrix(tmp_path)
    bogus = tmp_path / "bogus.txt"
    bogus.write_text("x")
    with pytest.raises(BuildError, match="is neither a directory nor a tar archive"):
        sources.fetch_upstream(m, [LocalProvider(bogus)], cache=tmp_path / "c")
