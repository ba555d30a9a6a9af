"""``python -m build_scripts``: build wheels, GPU bundles, and maintain versions and series.

Without ``--torch-version`` a command takes the default version: the newest one verified on
a GPU host (``gpu_verified`` in its upstream.yaml; ``versions --default`` prints it).

Errors are printed as ``error: <message>`` with exit status 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import errno
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from build_scripts import integration, matrix, repack, series
from build_scripts.errors import BuildError
from build_scripts.fsutil import mebibytes, mount_point
from build_scripts.paths import REPO_ROOT, cache_root, patches_root


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m build_scripts", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build dist/torch-X.Y.Z+um-*.whl")
    _version_arg(b)
    b.add_argument("--python", default="3.11", help="CPython version of the wheel (3.11)")
    b.add_argument("--dist", type=Path, default=None, help="output directory (dist/)")

    g = sub.add_parser("bundle", help="write the GPU-host bundle of an injection-path version")
    _version_arg(g)
    g.add_argument("--python", default="3.11", help="CPython version of the wheel (3.11)")
    g.add_argument("--dest", type=Path, default=None, help="output folder (.device/inject)")
    g.add_argument("--no-pytest", action="store_true", help="do not add pytest to the bundle")

    ls = sub.add_parser(
        "versions", help="list supported torch versions, each with its GPU record or none"
    )
    ls.add_argument("--default", action="store_true", help="print the default version only")

    s = sub.add_parser("series", help="maintain patches/<version>/series")
    ssub = s.add_subparsers(dest="series_command", required=True)
    c = ssub.add_parser("check", help="apply the series onto the pinned upstream, no fuzz")
    _version_arg(c)
    r = ssub.add_parser("refresh", help="re-apply and rewrite the patches with fresh context")
    _version_arg(r)
    r.add_argument(
        "--source",
        type=Path,
        default=None,
        help="upstream tree to refresh onto (default: the pinned upstream files)",
    )

    va = sub.add_parser("version", help="maintain patches/<version>/")
    vsub = va.add_subparsers(dest="version_command", required=True)
    add = vsub.add_parser("add", help="pin a new injection-path version and port its series")
    add.add_argument("version", help="torch release, e.g. 2.15.0")
    add.add_argument("--from", dest="base", default=None, help="version to port from")
    add.add_argument("--dest", type=Path, default=None, help="folder (patches/<version>)")
    add.add_argument("--no-build", action="store_true", help="skip the build check")

    v = sub.add_parser("validate", help="validate the RECORD of a wheel")
    v.add_argument("wheel", type=Path)
    return p


def _version_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--torch-version",
        default=None,
        help="torch version (default: the newest one verified on a GPU host)",
    )


def _version(args: argparse.Namespace) -> str:
    # Absent: the default. Given but empty (`make build TORCH_VERSION=`): an error that
    # names the make variable (matrix.load), never a silent default.
    if args.torch_version is None:
        return matrix.default_version()
    return str(args.torch_version)


def run(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        from build_scripts import pipeline

        result = pipeline.build(_version(args), args.python, dist=args.dist)
        print(result.wheel)
    elif args.command == "bundle":
        from build_scripts import bundle

        dest = args.dest or bundle.DEFAULT_DEST
        print(bundle.bundle(dest, _version(args), args.python, pylib=not args.no_pytest))
    elif args.command == "versions":
        if args.default:
            print(matrix.default_version())
        else:
            print("\n".join(version_lines()))
    elif args.command == "series":
        m = matrix.load(_version(args))
        if args.series_command == "check":
            return _series_check(m)
        upstream = args.source or _series_base(m)
        changed = series.refresh(m.series_file, upstream)
        print("refreshed: " + (", ".join(changed) if changed else "nothing changed"))
    elif args.command == "version":
        from build_scripts import pipeline, version_add

        dest = version_add.add(
            args.version, root=patches_root(), cache=cache_root(), base=args.base, dest=args.dest
        )
        print(dest)
        if not args.no_build and args.dest is None:
            _series_check(matrix.load(args.version))
            print(pipeline.build(args.version, "3.11").wheel)
    elif args.command == "validate":
        repack.validate(args.wheel)
        print(f"{args.wheel}: RECORD valid")
    return 0


def version_lines(root: Path | None = None) -> list[str]:
    """``versions``: each supported version, a tab, and whether a GPU run verified it (its
    record) and which one is the default."""
    versions = matrix.supported_versions(root)
    verified = {v: matrix.load(v, root).gpu_verified for v in versions}
    default = next((v for v in reversed(versions) if verified[v]), None)
    lines = []
    for v in versions:
        state = f"gpu_verified: {verified[v]}" if verified[v] else "not verified on a GPU"
        lines.append(f"{v}\t{state}" + (" (default)" if v == default else ""))
    return lines


def _series_base(m: matrix.VersionMatrix) -> Path:
    """What the series applies to, as the version's integration path says."""
    return integration.for_version(m).series_base(m, cache_root())


def _series_check(m: matrix.VersionMatrix) -> int:
    upstream = _series_base(m)
    names = series.read_series(m.series_file)
    with tempfile.TemporaryDirectory(prefix="um-series-check-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(upstream, tree)
        results = series.apply_series(m.series_file.parent, names, tree, strict=True)
    for res in results:
        print(f"ok   {res.patch} ({', '.join(res.files)})")
    print(f"{len(results)} patch(es) apply cleanly to {m.upstream.tag} with no fuzz or offset")
    return 0


def os_error_message(exc: OSError, places: Mapping[str, Path]) -> str:
    """One line for an operating-system error that no step turned into a BuildError:
    which path, what went wrong, what to do. ``places``: the cache and dist/, whose disks
    a full-disk error names."""
    path = f" {exc.filename}" if exc.filename else ""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        disks = "; ".join(_disk(what, p) for what, p in places.items())
        return (
            f"no space left on device writing{path or ' a file'} ({disks}): free space "
            "there, or set TORCH_UM_CACHE to a directory on a disk with more room"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"cannot write or read{path} ({reason}): make it writable, or set TORCH_UM_CACHE "
            "(the cache) or --dist (the wheel) to a directory you own"
        )
    if exc.errno == errno.ENOTDIR:
        return (
            f"cannot use{path} ({reason}): a part of that path is a file; remove the file, "
            "or set TORCH_UM_CACHE or --dist to another directory"
        )
    name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return f"{reason} ({name}){':' + path if path else ''}: fix that and run the build again"


def _disk(what: str, path: Path) -> str:
    try:
        free = mebibytes(shutil.disk_usage(path if path.exists() else path.parent).free)
        return f"{what} {path} is on {mount_point(path)}, {free} free"
    except OSError:
        return f"{what} {path}"


def _places(argv: Sequence[str] | None) -> dict[str, Path]:
    places = {"cache": cache_root()}
    args, _ = _parser().parse_known_args(argv)
    if args.command == "build":
        places["dist"] = args.dist or REPO_ROOT / "dist"
    return places


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(argv)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {os_error_message(exc, _places(argv))}", file=sys.stderr)
        return 2
    except zipfile.BadZipFile as exc:
        print(
            f"error: a zip archive the build read is damaged ({exc}): run the build again, "
            "which verifies every cached download first; if this repeats, remove the cache "
            f"with `rm -rf {cache_root()}`",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
