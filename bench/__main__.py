"""The benchmarks' one entry point.

    python -m bench                  # list the benchmarks and the probes, one line each
    python -m bench NAME [ARGS ...]  # run one: the same as python -m bench.NAME ARGS
                                     # (a probe: python -m bench.probes.NAME ARGS)

The listing reads each module's first docstring line without importing it, so it needs
no torch and no GPU.
"""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The benchmarks a reviewer reruns (bench/README.md); the other top-level modules are shared.
BENCHMARKS = ("residency", "classes", "host_memory", "oversubscribe", "step_time", "plot")


def summary(path: Path) -> str:
    """The first line of a module's docstring ('' if it has none); a package's is its
    __init__.py's."""
    if not path.exists() and (path.with_suffix("") / "__init__.py").is_file():
        path = path.with_suffix("") / "__init__.py"
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def probes() -> list[str]:
    return sorted(p.stem for p in (HERE / "probes").glob("*.py") if not p.name.startswith("__"))


def listing() -> str:
    width = max(len(n) for n in (*BENCHMARKS, *probes()))
    lines = ["benchmarks (python -m bench NAME --help):"]
    lines += [f"  {n:<{width}}  {summary(HERE / f'{n}.py')}" for n in BENCHMARKS]
    lines.append("probes (bench/probes/, one question each):")
    lines += [f"  {n:<{width}}  {summary(HERE / 'probes' / f'{n}.py')}" for n in probes()]
    return "\n".join(lines)


def module_of(name: str) -> str | None:
    """The module ``python -m bench NAME`` runs, or None for an unknown name."""
    if name in BENCHMARKS:
        return f"bench.{name}"
    if name in probes():
        return f"bench.probes.{name}"
    return None


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    module = module_of(argv[0])
    if module is None:
        print(f"bench: unknown benchmark or probe '{argv[0]}'\n{listing()}", file=sys.stderr)
        return 2
    sys.argv = [f"python -m {module}", *argv[1:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
