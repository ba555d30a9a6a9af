from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from build_scripts import series
from build_scripts.errors import BuildError

from .helpers import write_tree

BASE = "".join(f"line {i}\n" for i in range(1, 31))
HEADER = "Description: change two lines\n for a test.\nAuthor: tester\nForwarded: not-needed\n---\n"


def _diff(tmp: Path, rel: str, old: str, new: str) -> str:
    a, b = tmp / "diff-a", tmp / "diff-b"
    write_tree(a, {rel: old.encode()})
    write_tree(b, {rel: new.encode()})
    out = subprocess.run(
        ["diff", "-u", "--label", f"a/{rel}", "--label", f"b/{rel}", str(a / rel), str(b / rel)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return out


def _series(tmp: Path, patches: dict[str, str]) -> Path:
    d = tmp / "patches" / "9.1.0"  # patches/<version>/ as in the repository
    d.mkdir(parents=True, exist_ok=True)
    for name, text in patches.items():
        (d / name).write_text(text)
    (d / "series").write_text(
        "# test series\n\n" + "\n".join(f"{n}  # why" for n in patches) + "\n"
    )
    return d / "series"


def _changed(text: str, lineno: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[lineno - 1] = new
    return "".join(lines)


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "upstream", {"c10/cuda/X.cpp": BASE.encode()})


def test_series_that_applies(tmp_path: Path, upstream: Path) -> None:
    p1 = _diff(tmp_path, "c10/cuda/X.cpp", BASE, _changed(BASE, 10, "patched 10\n"))
    step1 = _changed(BASE, 10, "patched 10\n")
    p2 = _diff(tmp_path, "c10/cuda/X.cpp", step1, _changed(step1, 20, "patched 20\n"))
    sf = _series(tmp_path, {"0001-a.patch": HEADER + p1, "0002-b.patch": p2})
    assert series.read_series(sf) == ["0001-a.patch", "0002-b.patch"]
    dest = series.patched_tree(upstream, sf, tmp_path / "patched")
    text = (dest / "c10/cuda/X.cpp").read_text()
    assert "patched 10\n" in text and "patched 20\n" in text
    assert (upstream / "c10/cuda/X.cpp").read_text() == BASE  # upstream untouched
    assert not list(dest.rglob("*.orig")) and not list(dest.rglob("*.rej"))


def test_patched_tree_is_reused_and_keeps_mtimes(tmp_path: Path, upstream: Path) -> None:
    write_tree(upstream, {"c10/cuda/Y.cpp": b"unchanged\n"})
    p1 = _diff(tmp_path, "c10/cuda/X.cpp", BASE, _changed(BASE, 10, "patched 10\n"))
    sf = _series(tmp_path, {"0001-a.patch": p1})
    dest = series.patched_tree(upstream, sf, tmp_path / "patched")
    y = dest / "c10/cuda/Y.cpp"
    mtime = y.stat().st_mtime_ns
    assert series.patched_tree(upstream, sf, tmp_path / "patched") == dest
    # a changed series rebuilds the tree; the unchanged file keeps its mtime
    p1b = _diff(tmp_path, "c10/cuda/X.cpp", BASE, _changed(BASE, 11, "patched 11\n"))
    sf = _series(tmp_path, {"0001-a.patch": p1b})
    series.patched_tree(upstream, sf, tmp_path / "patched")
    assert "patched 11" in (dest / "c10/cuda/X.cpp").read_text()
    assert y.stat().st_mtime_ns == mtime


def test_hunk_needing_fuzz_is_refused(tmp_path: Path, upstream: Path) -> None:
    # the patch was made against a tree whose outermost context line (7) differed
    made_against = _changed(BASE, 7, "old context 7\n")
    p = _diff(tmp_path, "c10/cuda/X.cpp", made_against, _changed(made_against, 10, "patched 10\n"))
    sf = _series(tmp_path, {"0001-fuzzy.patch": HEADER + p})
    with pytest.raises(BuildError) as exc:
        series.patched_tree(upstream, sf, tmp_path / "patched")
    assert str(exc.value) == (
        "patch 0001-fuzzy.patch does not apply: hunk #1 of c10/cuda/X.cpp (at line 7) applies "
        "only with fuzz 1, and fuzz is refused: run `make series-refresh TORCH_VERSION=9.1.0` "
        "to give it fresh context"
    )
    assert not (tmp_path / "patched").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []


def test_failing_patch_names_patch_and_hunk(tmp_path: Path, upstream: Path) -> None:
    ok = _diff(tmp_path, "c10/cuda/X.cpp", BASE, _changed(BASE, 5, "patched 5\n"))
    # 0002: hunk #1 (line 15) applies, hunk #2 expects a line 25 that upstream lacks
    other = BASE.replace("line 25\n", "something else\n")
    two = _diff(
        tmp_path, "c10/cuda/X.cpp", other, _changed(_changed(other, 15, "p15\n"), 25, "p25\n")
    )
    assert two.count("@@ -") == 2
    previous = series.patched_tree(
        upstream, _series(tmp_path / "prev", {"0001-good.patch": ok}), tmp_path / "patched"
    )
    before = (previous / "c10/cuda/X.cpp").read_text()
    sf = _series(tmp_path, {"0001-good.patch": ok, "0002-bad.patch": HEADER + two})
    with pytest.raises(BuildError) as exc:
        series.patched_tree(upstream, sf, tmp_path / "patched")
    msg = str(exc.value)
    assert msg == "patch 0002-bad.patch does not apply: hunk #2 of c10/cuda/X.cpp FAILED at line 22"
    # the previous good tree is untouched, nothing half-patched is left
    assert (previous / "c10/cuda/X.cpp").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_offset_is_accepted_in_build_but_refused_by_check(tmp_path: Path, upstream: Path) -> None:
    shifted = "extra\n" * 3 + BASE
    p = _diff(tmp_path, "c10/cuda/X.cpp", BASE, _changed(BASE, 15, "patched 15\n"))
    sf = _series(tmp_path, {"0001-off.patch": p})
    write_tree(upstream, {"c10/cuda/X.cpp": shifted.encode()})
    tree = tmp_path / "work"
    subprocess.run(["cp", "-r", str(upstream), str(tree)], check=True)
    res = series.apply_series(sf.parent, ["0001-off.patch"], tree)
    assert res[0].offsets and res[0].offsets[0].offset == 3
    subprocess.run(["rm", "-r", str(tree)], check=True)
    subprocess.run(["cp", "-r", str(upstream), str(tree)], check=True)
    with pytest.raises(
        BuildError,
        match=r"patch 0001-off.patch applies only at an offset: hunk #1 of c10/cuda/X.cpp \(\+3 lines\)",
    ):
        series.apply_series(sf.parent, ["0001-off.patch"], tree, strict=True)


def test_patch_touching_unfetched_file(tmp_path: Path, upstream: Path) -> None:
    p = _diff(tmp_path, "c10/core/Z.cpp", "a\n", "b\n")
    sf = _series(tmp_path, {"0001-other.patch": p})
    with pytest.raises(
        BuildError, match="touches a file that is not among the fetched upstream files"
    ):
        series.patched_tree(upstream, sf, tmp_path / "patched")


def test_already_applied_patch(tmp_path: Path, upstream: Path) -> None:
    p = _diff(tmp_path, "c10/cuda/X.cpp", BASE, _changed(BASE, 10, "patched 10\n"))
    sf = _series(tmp_path, {"0001-a.patch": p, "0002-again.patch": p})
    with pytest.raises(BuildError, match="patch 0002-again.patch is already applied or reversed"):
        series.patched_tree(upstream, sf, tmp_path / "patched")


def test_series_file_errors(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="series file .* does not exist"):
        series.read_series(tmp_path / "series")
    (tmp_path / "series").write_text("0001-missing.patch\n")
    with pytest.raises(BuildError, match="lists 0001-missing.patch, which is not in"):
        series.read_series(tmp_path / "series")
    (tmp_path / "series").write_text("a.patch -p0\n")
    with pytest.raises(BuildError, match=r"series:1: expected a patch file name"):
        series.read_series(tmp_path / "series")


def test_refresh_rewrites_context_and_keeps_header(tmp_path: Path, upstream: Path) -> None:
    made_against = _changed(BASE, 9, "old context 9\n")
    body = _diff(
        tmp_path, "c10/cuda/X.cpp", made_against, _changed(made_against, 10, "patched 10\n")
    )
    stat = " c10/cuda/X.cpp | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)\n\n"
    sf = _series(
        tmp_path,
        {
            "0001-fuzzy.patch": HEADER
            + stat
            + "diff --git a/c10/cuda/X.cpp b/c10/cuda/X.cpp\n"
            + body
        },
    )
    assert series.refresh(sf, upstream) == ["0001-fuzzy.patch"]
    text = (sf.parent / "0001-fuzzy.patch").read_text()
    assert text.startswith(HEADER + " c10/cuda/X.cpp | 2 +-\n 1 file changed")
    assert "old context 9" not in text and " line 9\n" in text
    assert "\nindex " in text
    # the refreshed series now passes the strict check, and a second refresh is a no-op
    tree = tmp_path / "check"
    subprocess.run(["cp", "-r", str(upstream), str(tree)], check=True)
    series.apply_series(sf.parent, ["0001-fuzzy.patch"], tree, strict=True)
    assert series.refresh(sf, upstream) == []


def test_refresh_failure_writes_nothing(tmp_path: Path, upstream: Path) -> None:
    other = (
        BASE.replace("line 10\n", "unrelated\n")
        .replace("line 9\n", "x\n")
        .replace("line 11\n", "y\n")
    )
    bad = _diff(tmp_path, "c10/cuda/X.cpp", other, other.replace("unrelated\n", "patched\n"))
    sf = _series(tmp_path, {"0001-bad.patch": bad})
    before = (sf.parent / "0001-bad.patch").read_text()
    with pytest.raises(BuildError, match="patch 0001-bad.patch does not apply"):
        series.refresh(sf, upstream)
    assert (sf.parent / "0001-bad.patch").read_text() == before


def test_split_header_handles_format_patch_separator() -> None:
    text = (
        "Subject: x\n---\n a | 1 +\n\ndiff --git a/a b/a\n--- a/a\n+++ b/a\n@@ -1 +1 @@\n-x\n+y\n"
    )
    header, body = series.split_header(text)
    assert header == "Subject: x\n---\n a | 1 +\n\n"
    assert body.startswith("diff --git")


def test_repository_patch_dirs_hold_only_their_series() -> None:
    """A patch file that no series lists is never applied: it is a leftover, not a change."""
    root = Path(__file__).resolve().parents[2] / "patches"
    dirs = sorted(p.parent for p in root.glob("*/series"))
    assert dirs, f"no patches/<version>/series under {root}"
    for d in dirs:
        listed = set(series.read_series(d / "series"))
        present = {p.name for p in d.glob("*.patch")}
        assert present == listed, f"{d.name}: unlisted {sorted(present - listed)}"
