"""The honest platform tag of the rebuilt wheel.

auditwheel's manylinux policies list, per policy, the GLIBC/GLIBCXX/CXXABI/GCC symbol
versions a library may require. The rebuilt library gets the oldest policy covering what
it requires; the wheel gets the newer (more restrictive) of that and the official wheel's
own tag, since every other library in the wheel is unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from auditwheel.architecture import Architecture
from auditwheel.libc import Libc
from auditwheel.policy import WheelPolicies

from build_scripts.errors import BuildError

_POLICY_FAMILIES = ("GLIBC_", "GLIBCXX_", "CXXABI_", "GCC_")
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_TAG = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")


def _policies(arch: str) -> WheelPolicies:
    try:
        return WheelPolicies(libc=Libc.GLIBC, arch=Architecture(arch))
    except ValueError:
        raise BuildError(
            f"auditwheel has no manylinux policies for architecture {arch!r}"
        ) from None


def required_versions(version_needs: Iterable[str]) -> set[str]:
    """The symbol versions that manylinux policies constrain (GLIBC_2.34, ...)."""
    return {v for v in version_needs if v.startswith(_POLICY_FAMILIES)}


def tag_for_versions(version_needs: Iterable[str], arch: str = "x86_64") -> str:
    """Oldest manylinux tag whose policy covers every required symbol version."""
    needed = required_versions(version_needs)
    policy = _policies(arch).versioned_symbols_policy({"lib": needed})
    if not policy.name.startswith("manylinux"):
        newest = sorted(v for v in needed if v.startswith("GLIBC_"))
        raise BuildError(
            f"no manylinux policy covers the symbol versions the rebuilt library needs "
            f"({', '.join(newest[-3:])}): build on an older distribution (docker/)"
        )
    return str(policy.name)


def normalize(tag: str) -> str:
    """``manylinux1_x86_64`` -> ``manylinux_2_5_x86_64`` (PEP 600 spelling)."""
    for legacy, (major, minor) in _LEGACY.items():
        if tag.startswith(legacy + "_"):
            return f"manylinux_{major}_{minor}_{tag[len(legacy) + 1 :]}"
    return tag


def glibc_of(tag: str) -> tuple[int, int]:
    m = _TAG.match(normalize(tag))
    if not m:
        raise BuildError(f"{tag!r} is not a manylinux platform tag")
    return int(m.group(1)), int(m.group(2))


def arch_of(tag: str) -> str:
    m = _TAG.match(normalize(tag))
    if not m:
        raise BuildError(f"{tag!r} is not a manylinux platform tag")
    return m.group(3)


def combine(official: str, rebuilt: str) -> str:
    """The more restrictive (newer glibc) of two manylinux tags, in PEP 600 spelling."""
    a, b = normalize(official), normalize(rebuilt)
    if arch_of(a) != arch_of(b):
        raise BuildError(f"platform tags disagree on the architecture: {official} vs {rebuilt}")
    return a if glibc_of(a) >= glibc_of(b) else b


def wheel_platform_tag(official_file_tag: str, rebuilt_version_needs: Iterable[str]) -> str:
    arch = arch_of(official_file_tag)
    return combine(official_file_tag, tag_for_versions(rebuilt_version_needs, arch))
