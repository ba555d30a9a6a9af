"""conftest.py for upstream's test/test_cuda.py run by tests/gpu/upstream_test_cuda.sh (copied
beside the upstream file, never used by this repository's own tests).

The stored upstream file may be newer than the torch it runs against: the version of
torch 2.11.0's commit is not stored, the nearest one imports ``TEST_CUDAMALLOCASYNC`` from
``torch.testing._internal.common_utils``, which the 2.11.0 wheel does not have (older
upstream files defined it themselves). The test file stays unmodified; the name is given to
that module here, before the test module is imported, with the meaning it has upstream:
the CUDA allocator backend is cudaMallocAsync. Nothing else is changed, and where the
wheel has the name it is left alone.
"""

from __future__ import annotations

import torch
import torch.testing._internal.common_utils as common_utils

if not hasattr(common_utils, "TEST_CUDAMALLOCASYNC"):
    common_utils.TEST_CUDAMALLOCASYNC = bool(  # type: ignore[attr-defined]
        torch.cuda.is_available()
        and torch.cuda.memory.get_allocator_backend() == "cudaMallocAsync"
    )
