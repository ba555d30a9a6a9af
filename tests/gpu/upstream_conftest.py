"""conftest.py for upstream's test/test_cuda.py run by tests/gpu/upstream_test_cuda.sh (copied
beside the upstream file, never used by this repository's own tests).

The stored upstream file may be newer than the torch it runs against: the version of
torch 2.11.0's commit is not stored, the nearest one imports ``TEST_CUDAMALLOCASYNC`` from
``torch.testing._internal.common_utils``, which the 2.11.0 wheel does not have (older
upstream files defined it themselves). The test file stays unmodified; the name is given to
that module here, before the test module is imported, with the meaning it has upstream:
the CUDA allocator backend is cudaMallocAsync. Nothing else is changed, and where the
wheel has the name it is left alone.

The GPU host's cuDNN may be older than the one a staged wheel was built with (torch 2.15.0
is built with cuDNN 9.26; the host has 9.19): then ``torch.backends.cudnn`` refuses to
initialise, and ``TEST_CUDNN``, which the test file reads while its classes are defined,
raises instead of answering, so nothing is collected. Where it would raise, it is False:
the tests that need cuDNN are skipped, under stock and +um alike, and the reason is written
to the file ``UPSTREAM_CONFTEST_NOTES`` names, for the record.
"""

from __future__ import annotations

import os

import torch
import torch.testing._internal.common_cuda as common_cuda
import torch.testing._internal.common_utils as common_utils

if not hasattr(common_utils, "TEST_CUDAMALLOCASYNC"):
    common_utils.TEST_CUDAMALLOCASYNC = bool(  # type: ignore[attr-defined]
        torch.cuda.is_available()
        and torch.cuda.memory.get_allocator_backend() == "cudaMallocAsync"
    )


def _note(line: str) -> None:
    path = os.environ.get("UPSTREAM_CONFTEST_NOTES")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


if torch.cuda.is_available():
    try:
        torch.backends.cudnn.is_acceptable(torch.tensor(1.0, device="cuda"))
    except RuntimeError as e:
        common_cuda.TEST_CUDNN = False  # type: ignore[assignment]
        _note(f"cuDNN refused to initialise, tests that need it skipped: {str(e).split('. ')[0]}")
