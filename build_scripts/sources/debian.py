"""Debian's source package as the fallback for exact upstream sources.

The archive is found through this system's own apt configuration (one-line ``*.list``
and deb822 ``*.sources`` files): entries whose suite names a Debian release serve the
Debian archive. From there: ``dists/<suite>/<component>/source/Sources.xz`` gives the
package's pool directory, then the orig tarball is downloaded into the cache, verified
against upstream.yaml, and only the pinned files are extracted.
"""

from __future__ import annotations

import lzma
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from build_scripts.errors import BuildError
from build_scripts.fetch import Fetcher, FetchError, cached_url, urllib_fetch
from build_scripts.matrix import DebianSource, VersionMatrix
from build_scripts.sources.base import ProviderUnavailable
from build_scripts.sources.tarball import extract_members

DEBIAN_RELEASES = frozenset(
    """hamm slink potato woody sarge etch lenny squeeze wheezy jessie stretch buster
    bullseye bookworm trixie forky duke sid oldoldstable oldstable stable testing
    unstable experimental""".split()
)
_SUITE_SUFFIX = re.compile(r"(-updates|-backports|-backports-sloppy|-proposed-updates)$")


@dataclass(frozen=True)
class AptEntry:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    origin_file: Path


def parse_one_line(text: str, origin: Path) -> Iterator[AptEntry]:
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if parts[0] not in ("deb", "deb-src"):
            continue
        rest = parts[1:]
        if rest and rest[0].startswith("["):
            while rest and not rest[0].endswith("]"):
                rest = rest[1:]
            rest = rest[1:]
        if len(rest) < 2:
            continue
        yield AptEntry(rest[0], (rest[1],), tuple(rest[2:]), origin)


def parse_deb822(text: str, origin: Path) -> Iterator[AptEntry]:
    for stanza in _deb822_stanzas(text):
        types = stanza.get("types", "").split()
        if not {"deb", "deb-src"} & set(types):
            continue
        if stanza.get("enabled", "yes").strip().lower() == "no":
            continue
        for uri in stanza.get("uris", "").split():
            yield AptEntry(
                uri,
                tuple(stanza.get("suites", "").split()),
                tuple(stanza.get("components", "").split()),
                origin,
            )


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    """deb822 paragraphs as dicts with lower-case keys; continuation lines joined."""
    fields: dict[str, str] = {}
    key = None
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields:
                yield fields
            fields, key = {}, None
            continue
        if raw[0] in " \t" and key is not None:
            fields[key] += "\n" + raw.strip()
            continue
        name, sep, value = raw.partition(":")
        if sep:
            key = name.strip().lower()
            fields[key] = value.strip()
    if fields:
        yield fields


def read_apt_config(etc_apt: Path = Path("/etc/apt")) -> list[AptEntry]:
    entries: list[AptEntry] = []
    main = etc_apt / "sources.list"
    if main.is_file():
        entries += parse_one_line(main.read_text(errors="replace"), main)
    d = etc_apt / "sources.list.d"
    if d.is_dir():
        for f in sorted(d.iterdir()):
            if f.suffix == ".list":
                entries += parse_one_line(f.read_text(errors="replace"), f)
            elif f.suffix == ".sources":
                entries += parse_deb822(f.read_text(errors="replace"), f)
    return entries


def debian_archive_uris(entries: Sequence[AptEntry]) -> list[str]:
    """Base URIs that serve the Debian archive proper (not security, not third party)."""
    uris: list[str] = []
    for e in entries:
        if not e.uri.startswith(("http://", "https://", "file:")):
            continue
        if any(_SUITE_SUFFIX.sub("", s) in DEBIAN_RELEASES for s in e.suites):
            uri = e.uri.rstrip("/") + "/"
            if uri not in uris:
                uris.append(uri)
    return uris


@dataclass(frozen=True)
class SourceRecord:
    package: str
    version: str
    directory: str
    sha256_files: dict[str, str]  # file name -> sha256


def parse_sources_index(text: str) -> Iterator[SourceRecord]:
    for st in _deb822_stanzas(text):
        files: dict[str, str] = {}
        for line in st.get("checksums-sha256", "").splitlines():
            parts = line.split()
            if len(parts) == 3:
                files[parts[2]] = parts[0]
        yield SourceRecord(
            st.get("package", ""), st.get("version", ""), st.get("directory", ""), files
        )


def find_orig(records: Iterator[SourceRecord], pin: DebianSource) -> SourceRecord | None:
    """The pinned version's record, else any record of the package with the same orig
    tarball (a newer Debian revision of the same upstream release)."""
    fallback = None
    for rec in records:
        if rec.package != pin.package or pin.orig_tarball not in rec.sha256_files:
            continue
        if rec.version == pin.version:
            return rec
        if rec.sha256_files[pin.orig_tarball] == pin.sha256 and fallback is None:
            fallback = rec
    return fallback


class DebianProvider:
    def __init__(
        self,
        *,
        cache_dir: Path,
        etc_apt: Path = Path("/etc/apt"),
        fetcher: Fetcher = urllib_fetch,
        timeout: float = 60.0,
    ) -> None:
        self.cache_dir = cache_dir
        self.etc_apt = etc_apt
        self.fetcher = fetcher
        self.timeout = timeout

    @property
    def name(self) -> str:
        return "Debian source package"

    def tarball(self, pin: DebianSource) -> Path:
        """The orig tarball in the cache, downloading it through apt's archive if needed."""
        dest = self.cache_dir / "src" / pin.orig_tarball
        if dest.is_file():
            try:
                return cached_url("", dest, pin.sha256, fetcher=_no_fetch)
            except (BuildError, FetchError):
                pass  # corrupt: fetch again below
        uris = debian_archive_uris(read_apt_config(self.etc_apt))
        if not uris:
            raise ProviderUnavailable(
                f"no Debian archive in the apt configuration under {self.etc_apt}"
            )
        reasons = []
        for base in uris:
            index_url = f"{base}dists/{pin.suite}/{pin.component}/source/Sources.xz"
            try:
                rec = self._lookup(index_url, pin)
            except FetchError as exc:
                reasons.append(str(exc))
                continue
            if rec is None:
                reasons.append(f"{index_url} lists no {pin.package} {pin.version}")
                continue
            url = f"{base}{rec.directory.strip('/')}/{pin.orig_tarball}"
            try:
                return cached_url(url, dest, pin.sha256, fetcher=self.fetcher, timeout=self.timeout)
            except FetchError as exc:
                reasons.append(str(exc))
        raise ProviderUnavailable("; ".join(reasons))

    def _lookup(self, index_url: str, pin: DebianSource) -> SourceRecord | None:
        idx = self.cache_dir / "debian" / f"{pin.suite}-{pin.component}-Sources.xz"
        self.fetcher(index_url, idx, self.timeout)
        try:
            text = lzma.decompress(idx.read_bytes()).decode("utf-8", errors="replace")
        except lzma.LZMAError as exc:
            raise FetchError(f"{index_url}: not an xz file ({exc})") from None
        return find_orig(parse_sources_index(text), pin)

    def provide(self, matrix: VersionMatrix, paths: Sequence[str], dest: Path) -> None:
        pin = matrix.debian
        if pin is None:
            raise ProviderUnavailable("upstream.yaml has no 'debian' section")
        tarball = self.tarball(pin)
        extract_members(tarball, paths, dest, top_dir=pin.top_dir)


def _no_fetch(url: str, dest: Path, timeout: float) -> None:
    raise FetchError("not cached")
