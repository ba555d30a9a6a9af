"""Apply, check and refresh a version's patch series (``patches/<version>/series``).

The series file names one patch per line (``#`` starts a comment). Patches apply with
GNU patch at ``-p1`` and zero fuzz, each one dry-run first, into a scratch copy of the
upstream files that is swapped into place only when every patch applied: a failure
never leaves a half-patched tree behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from build_scripts import progress
from build_scripts.errors import BuildError
from build_scripts.fsutil import (
    MANIFEST,
    atomic_dir,
    atomic_write_text,
    digest_of,
    manifest_problem,
    read_json,
    sha256_file,
    write_manifest,
)
from build_scripts.toolchain import gnu_patch

_FILE_LINE = re.compile(r"^(?:patching|checking) file (.+)$")
_HUNK_FAILED = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_HUNK_OFFSET = re.compile(r"^Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")
_HUNK_FUZZ = re.compile(
    r"^Hunk #(\d+) succeeded at (\d+)(?: \(offset -?\d+ lines?\))? with fuzz (\d+)"
)
_STAMP = ".series-stamp.json"


@dataclass(frozen=True)
class HunkNote:
    file: str
    hunk: int
    line: int
    offset: int = 0
    fuzz: int = 0


@dataclass
class PatchResult:
    patch: str
    files: list[str] = field(default_factory=list)
    offsets: list[HunkNote] = field(default_factory=list)
    fuzzed: list[HunkNote] = field(default_factory=list)


def read_series(series_file: Path) -> list[str]:
    if not series_file.is_file():
        raise BuildError(f"series file {series_file} does not exist")
    names = []
    for n, raw in enumerate(series_file.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2 or (len(parts) == 2 and parts[1] != "-p1"):
            raise BuildError(
                f"{series_file}:{n}: expected a patch file name (optionally '-p1'), got {raw!r}"
            )
        names.append(parts[0])
    for name in names:
        if not (series_file.parent / name).is_file():
            raise BuildError(f"{series_file} lists {name}, which is not in {series_file.parent}")
    return names


def _run_patch(patch_file: Path, tree: Path, *, dry_run: bool, fuzz: int) -> tuple[int, str]:
    cmd = [
        str(gnu_patch()),
        "-p1",
        f"--fuzz={fuzz}",
        "--no-backup-if-mismatch",
        "--batch",
        "--forward",
        "--reject-file=-",
        "--quoting-style=literal",
        "-d",
        str(tree),
        "-i",
        str(patch_file.resolve()),
    ]
    if dry_run:
        cmd.append("--dry-run")
    env = dict(os.environ, LC_ALL="C")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _parse(patch: str, output: str) -> tuple[PatchResult, list[HunkNote]]:
    result = PatchResult(patch)
    failed: list[HunkNote] = []
    current = "?"
    for line in output.splitlines():
        if m := _FILE_LINE.match(line):
            current = m.group(1)
            if current not in result.files:
                result.files.append(current)
        elif m := _HUNK_FAILED.match(line):
            failed.append(HunkNote(current, int(m.group(1)), int(m.group(2))))
        elif m := _HUNK_FUZZ.match(line):
            result.fuzzed.append(
                HunkNote(current, int(m.group(1)), int(m.group(2)), fuzz=int(m.group(3)))
            )
        elif m := _HUNK_OFFSET.match(line):
            result.offsets.append(
                HunkNote(current, int(m.group(1)), int(m.group(2)), offset=int(m.group(3)))
            )
    return result, failed


def apply_patch(patch_file: Path, tree: Path, *, fuzz: int = 0) -> PatchResult:
    """Dry-run then apply one patch; raise BuildError naming the patch and hunk on failure."""
    name = patch_file.name
    rc, out = _run_patch(patch_file, tree, dry_run=True, fuzz=fuzz)
    result, failed = _parse(name, out)
    if rc != 0:
        raise BuildError(_failure_message(patch_file, tree, out, failed, fuzz))
    rc, out = _run_patch(patch_file, tree, dry_run=False, fuzz=fuzz)
    result, failed = _parse(name, out)
    if rc != 0:  # dry run passed, so this is unexpected (disk full, permissions)
        raise BuildError(f"patch {name} passed its dry run but failed to apply:\n{out.strip()}")
    return result


def refresh_hint(series_dir: Path) -> str:
    """The command that refreshes the series in ``series_dir`` (``patches/<version>``)."""
    return f"`make series-refresh TORCH_VERSION={series_dir.name}`"


def _failure_message(
    patch_file: Path, tree: Path, out: str, failed: list[HunkNote], fuzz: int
) -> str:
    name = patch_file.name
    if "can't find file to patch" in out:
        return (
            f"patch {name} touches a file that is not among the fetched upstream files "
            "(add it to 'sources' in upstream.yaml with its sha256):\n" + out.strip()
        )
    if "previously applied" in out:
        return f"patch {name} is already applied or reversed:\n{out.strip()}"
    if not failed:
        return f"patch {name} does not apply:\n{out.strip()}"
    parts = []
    if fuzz == 0:
        # would it apply with fuzz? then say so: the patch needs a refresh, not a rewrite
        with tempfile.TemporaryDirectory() as probe:
            shutil.copytree(tree, probe, dirs_exist_ok=True)
            rc, fuzzy_out = _run_patch(patch_file, Path(probe), dry_run=True, fuzz=3)
            fuzzy, _ = _parse(name, fuzzy_out)
        needs = {(h.file, h.hunk): h.fuzz for h in fuzzy.fuzzed} if rc == 0 else {}
    else:
        needs = {}
    for h in failed:
        if (h.file, h.hunk) in needs:
            parts.append(
                f"hunk #{h.hunk} of {h.file} (at line {h.line}) applies only with fuzz "
                f"{needs[(h.file, h.hunk)]}, and fuzz is refused: run "
                f"{refresh_hint(patch_file.parent)} to give it fresh context"
            )
        else:
            parts.append(f"hunk #{h.hunk} of {h.file} FAILED at line {h.line}")
    return f"patch {name} does not apply: " + "; ".join(parts)


def apply_series(
    patch_dir: Path, names: Sequence[str], tree: Path, *, strict: bool = False
) -> list[PatchResult]:
    """Apply ``names`` from ``patch_dir`` in order onto ``tree`` (modified in place).

    ``strict`` also refuses hunks that apply at an offset (``series check``).
    """
    results = []
    for name in names:
        res = apply_patch(patch_dir / name, tree)
        if strict and res.offsets:
            where = ", ".join(
                f"hunk #{h.hunk} of {h.file} ({h.offset:+d} lines)" for h in res.offsets
            )
            raise BuildError(
                f"patch {name} applies only at an offset: {where}; run "
                f"{refresh_hint(patch_dir)} to refresh its context"
            )
        results.append(res)
    return results


def series_inputs(series_file: Path) -> dict[str, str]:
    """sha256 of the series file and of every patch it lists (a cache key)."""
    names = read_series(series_file)
    keys = {"series": sha256_file(series_file)}
    for name in names:
        keys[name] = sha256_file(series_file.parent / name)
    return keys


def patched_tree(upstream: Path, series_file: Path, dest: Path) -> Path:
    """``dest`` := ``upstream`` with the series applied; reused when its inputs match.

    Files whose content did not change keep the mtime they had in the previous tree, so
    the following Ninja build stays incremental. A tree that no longer matches its
    manifest (a file changed, added or removed since it was made) is made again.
    """
    names = read_series(series_file)
    key = {
        "upstream": {
            str(p.relative_to(upstream)): sha256_file(p)
            for p in sorted(upstream.rglob("*"))
            if p.is_file() and p.name != MANIFEST  # the manifest records stat, not content
        },
        "patches": series_inputs(series_file),
    }
    stamp = digest_of(key)
    if (read_json(dest / _STAMP) or {}).get("key") == stamp:
        problem = manifest_problem(dest)
        if problem is None:
            return dest
        progress.step(f"{dest} differs from what was patched ({problem}): patching it again")
    progress.step(f"applying {len(names)} patch(es) from {series_file}")
    with atomic_dir(dest) as tmp:
        shutil.copytree(upstream, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(MANIFEST))
        apply_series(series_file.parent, names, tmp)
        _keep_mtimes(dest, tmp)
        atomic_write_text(tmp / _STAMP, f'{{"key": "{stamp}"}}\n')
        write_manifest(tmp)
    return dest


def _keep_mtimes(old: Path, new: Path) -> None:
    if not old.is_dir():
        return
    for p in new.rglob("*"):
        if not p.is_file():
            continue
        q = old / p.relative_to(new)
        if (
            q.is_file()
            and q.stat().st_size == p.stat().st_size
            and sha256_file(q) == sha256_file(p)
        ):
            st = q.stat()
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


# ----------------------------------------------------------------- maintainer: refresh


def split_header(text: str) -> tuple[str, str]:
    """(DEP-3 header, diff body): the body starts at the first ``diff``/``Index:``/``---``."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(("diff ", "Index: ", "--- ")) and (
            not line.startswith("--- ") or (i + 1 < len(lines) and lines[i + 1].startswith("+++ "))
        ):
            return "".join(lines[:i]), "".join(lines[i:])
    return text, ""


def unified_diff(before: Path, after: Path, rel: str) -> str:
    """``diff -u`` of one file between two trees, git-style: a ``diff --git`` line, then
    ``---``/``+++`` labelled a/ and b/ (or /dev/null for a created or deleted file)."""
    old, new = before / rel, after / rel
    old_label = f"a/{rel}" if old.exists() else "/dev/null"
    new_label = f"b/{rel}" if new.exists() else "/dev/null"
    diff = shutil.which("diff")
    if not diff:
        raise BuildError("required tool 'diff' not found on PATH: install diffutils")
    proc = subprocess.run(
        [diff, "-u", "-p", "-N", "--label", old_label, "--label", new_label, str(old), str(new)],
        capture_output=True,
        text=True,
        env=dict(os.environ, LC_ALL="C"),
        check=False,
    )
    if proc.returncode > 1:
        raise BuildError(f"diff failed for {rel}: {proc.stderr.strip()}")
    if not proc.stdout:
        return ""
    text = _full_function_lines(proc.stdout, old.read_text().splitlines() if old.exists() else [])
    if old.exists() and new.exists():
        index = f"index {_blob_id(old)}..{_blob_id(new)} 100644\n"
    elif new.exists():
        index = f"new file mode 100644\nindex 0000000..{_blob_id(new)}\n"
    else:
        index = f"deleted file mode 100644\nindex {_blob_id(old)}..0000000\n"
    return f"diff --git a/{rel} b/{rel}\n{index}{text}"


def _blob_id(path: Path) -> str:
    """git's abbreviated blob id of a file (as in the ``index`` line of git diff)."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()[:7]


_HUNK_HEADER = re.compile(r"^(@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@) (.+)$")


def _full_function_lines(diff_text: str, old_lines: list[str]) -> str:
    """GNU diff cuts the ``@@ ... @@ <function>`` context at 40 characters; git keeps up
    to 80. Restore the line from the old file so refreshed patches match git's."""
    out = []
    for line in diff_text.splitlines(keepends=True):
        m = _HUNK_HEADER.match(line.rstrip("\n"))
        if m:
            start, cut = int(m.group(2)), m.group(3)
            for candidate in reversed(old_lines[: max(start - 1, 0)]):
                if candidate.startswith(cut):
                    line = f"{m.group(1)} {candidate.rstrip()[:80]}\n"
                    break
        out.append(line)
    return "".join(out)


def diffstat(body: str) -> str:
    """git-style diffstat of a patch body (`` path | N +++--`` lines and a summary)."""
    counts: dict[str, list[int]] = {}
    current = None
    for line in body.splitlines():
        if line.startswith("+++ "):
            current = line[4:].removeprefix("b/")
            counts.setdefault(current, [0, 0])
        elif line.startswith("--- ") or line.startswith("diff --git "):
            if line.startswith("--- ") and current is None:
                continue
            current = None if line.startswith("diff --git ") else current
        elif current is not None and line.startswith("+"):
            counts[current][0] += 1
        elif current is not None and line.startswith("-"):
            counts[current][1] += 1
    if not counts:
        return ""
    width = max(len(p) for p in counts)
    lines = [f" {p.ljust(width)} | {a + d} {'+' * a}{'-' * d}" for p, (a, d) in counts.items()]
    ins = sum(a for a, _ in counts.values())
    dels = sum(d for _, d in counts.values())
    n = len(counts)
    lines.append(
        f" {n} file{'s' if n != 1 else ''} changed, {ins} insertion{'s' if ins != 1 else ''}(+), "
        f"{dels} deletion{'s' if dels != 1 else ''}(-)"
    )
    return "\n".join(lines) + "\n"


_STAT_LINE = re.compile(r"^ (\S.*\S) +\| +\d+ [+-]*$|^ \d+ files? changed")


def replace_diffstat(header: str, body: str) -> str:
    """In a ``git format-patch`` header (a ``---`` line then a diffstat), put a fresh
    diffstat; other headers (DEP-3 only) are returned unchanged."""
    lines = header.splitlines(keepends=True)
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].rstrip("\n") == "---":
            rest = lines[i + 1 :]
            stat_end = 0
            while stat_end < len(rest) and _STAT_LINE.match(rest[stat_end].rstrip("\n")):
                stat_end += 1
            if stat_end == 0:
                return header
            tail = rest[stat_end:]
            return "".join(lines[: i + 1]) + diffstat(body) + "".join(tail)
    return header


def refresh(series_file: Path, upstream: Path) -> list[str]:
    """Re-apply the series onto ``upstream`` (fuzz allowed) and rewrite every patch with
    fresh context, keeping each patch's DEP-3 header. Returns the patches that changed.

    All patches are regenerated before any file is written; a patch that does not apply
    even with fuzz stops the refresh and leaves every patch file as it was.
    """
    names = read_series(series_file)
    new_texts: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="um-refresh-") as tmp:
        work = Path(tmp) / "work"
        shutil.copytree(upstream, work)
        for name in names:
            path = series_file.parent / name
            before = Path(tmp) / "before"
            shutil.rmtree(before, ignore_errors=True)
            shutil.copytree(work, before)
            res = apply_patch(path, work, fuzz=3)
            header, _ = split_header(path.read_text())
            body = "".join(unified_diff(before, work, rel) for rel in res.files)
            new_texts[name] = replace_diffstat(header, body) + body
    changed = []
    for name, text in new_texts.items():
        path = series_file.parent / name
        if path.read_text() != text:
            atomic_write_text(path, text)
            changed.append(name)
    return changed
