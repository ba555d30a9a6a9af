"""Make a carried torch version ready on the GPU host: its wheel and the extras it needs.

    python3 tests/gpu/host_extras.py VERSION --bundle DIR --ship DIR --work DIR

Joins the official wheel the bundle was built for (checked against the bundle's pin) and the
wheels ``tests/gpu/host_extras.json`` lists for VERSION (checked against theirs) from their
parts in ``--ship`` (tests/gpu/ship.py), unpacks each extra under ``--work`` (a library file
that replaces one of the host's ``nvidia/`` tree, or a Python package), and prints the shell
assignments tests/gpu/run_version_on_device.sh evaluates: ``TORCH_WHEEL``, ``NVIDIA_LIBS``
(``REL=PATH`` words for stage_torch.py ``--lib``) and ``EXTRA_PYTHONPATH`` (empty without
packages). An entry with ``"hide": true`` names a package of the host built for another torch
that must look absent: a ``sitecustomize.py`` on ``EXTRA_PYTHONPATH`` hides it. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import NamedTuple

if __package__:
    from .ship import ShipError, join, unzip
else:  # run as a script: python3 tests/gpu/host_extras.py
    from ship import ShipError, join, unzip  # type: ignore[no-redef,import-not-found]

EXTRAS = Path(__file__).with_name("host_extras.json")


class Ready(NamedTuple):
    wheel: Path
    libs: list[str]  # REL=PATH
    pythonpath: Path | None


def prepare(version: str, bundle: Path, ship: Path, work: Path, extras: Path = EXTRAS) -> Ready:
    manifest = json.loads((bundle / "manifest.json").read_text())
    name, pin = manifest["built_for_wheel"], manifest["wheel_sha256"]
    wheel = join(ship / f"{name}.parts.json", work, pin)
    libs: list[str] = []
    pkgs = work / "pkgs"
    has_pkgs = False
    hidden: list[str] = []
    for e in json.loads(extras.read_text()).get(version, []):
        if e.get("hide"):
            hidden.append(e["package"])
            continue
        got = join(ship / f"{e['filename']}.parts.json", work, e["sha256"])
        if "lib" in e:
            target = work / "lib" / e["lib"]
            unzip(got, target, e["member"])
            libs.append(f"{e['lib']}={target}")
        else:
            unzip(got, pkgs)
            has_pkgs = True
    if hidden:
        pkgs.mkdir(parents=True, exist_ok=True)
        (pkgs / "sitecustomize.py").write_text(hide_source(hidden))
        has_pkgs = True
    return Ready(wheel, libs, pkgs if has_pkgs else None)


def hide_source(packages: list[str]) -> str:
    """A ``sitecustomize`` that makes ``packages`` absent: ``import`` raises
    ModuleNotFoundError and ``importlib.util.find_spec`` gives None (a ``None`` entry of
    ``sys.modules``), so libraries that probe for them (transformers for torchaudio) take
    their path without them."""
    names = ", ".join(repr(p) for p in packages)
    return (
        '"""Written by tests/gpu/host_extras.py: packages of the host built for another torch."""\n'
        "import sys\n\n"
        f"for _name in ({names},):\n"
        "    sys.modules[_name] = None  # type: ignore[assignment]\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("version")
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--ship", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    a = ap.parse_args(argv)
    if not (a.bundle / "manifest.json").is_file():
        print(f"host_extras: no bundle at {a.bundle} (build_scripts bundle)", file=sys.stderr)
        return 2
    try:
        ready = prepare(a.version, a.bundle, a.ship, a.work)
    except ShipError as e:
        print(f"host_extras: {e}", file=sys.stderr)
        return 1
    print(f"TORCH_WHEEL={shlex.quote(str(ready.wheel))}")
    print(f"NVIDIA_LIBS={shlex.quote(' '.join(ready.libs))}")
    print(f"EXTRA_PYTHONPATH={shlex.quote(str(ready.pythonpath or ''))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
