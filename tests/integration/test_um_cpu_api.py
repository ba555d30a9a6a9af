"""torch.cuda.um in each built wheel, installed into a fresh venv, on a machine without a GPU.

Both integration paths ship c10_overlay/torch/cuda/um.py; what differs is where the engine
lives and who imports the module:

- 2.6.0 (source path): the engine is inside the rebuilt ``torch/lib/libc10_cuda.so``;
  torch/cuda/__init__.py, patched by the series (0004), imports ``torch.cuda.um``.
- 2.11.0 (inject path): the engine is ``torch/lib/libtorch_um.so``, loaded with RTLD_GLOBAL
  by the patched torch/__init__.py before the CUDA libraries; the patched
  torch/cuda/__init__.py imports ``torch.cuda.um``.

Every function used here is one that um.py documents as callable without a GPU: none may
initialise CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from .conftest import Build, Install, probe

MiB = 1 << 20

pytestmark = pytest.mark.integration

KEYS = (
    "Keys: enabled, max_managed, device_budget, host_headroom, prefetch, policy, discard, hooks, "
    "op_signal, op_lookahead, op_stage, evict_warm_first, predict, predict_lookahead, predict_copy_sms, "
    "predict_copy_kernel, predict_stage_kernel, "
    "predict_ddp_buckets, predict_programs, read_copies, host_alloc, host_alloc_min, "
    "host_copy_kernel, "
    "host_copy_cpu_share, pageable_copy_cpu, pin_in_place."
)
# The residency settings, unchanged by every configure() call below.
RESIDENCY = {
    "policy": "lru",
    "discard": "True",
    "hooks": "True",
    "op_signal": "True",
    "op_lookahead": "0",
    "op_stage": "False",
    "evict_warm_first": "True",
    "predict": "True",
    "predict_lookahead": str(1 << 30),
    "predict_copy_sms": "auto",
    "predict_copy_kernel": "lean",
    "predict_stage_kernel": "foreach",
    "predict_ddp_buckets": "True",
    "predict_programs": "True",
    "read_copies": "False",
    "host_alloc": "default",
    "host_alloc_min": str(1 << 20),
    "host_copy_kernel": "True",
    "host_copy_cpu_share": "0.35",
    "pageable_copy_cpu": "True",
    "pin_in_place": "False",
}
DEFAULTS = {
    "enabled": "True",
    "max_managed": "none",
    "device_budget": "90%",
    "host_headroom": str(2 << 30),
    "prefetch": "True",
    **RESIDENCY,
}


class UmPath(NamedTuple):
    version: str
    engine: str  # file name of the library that carries the engine
    imported_by_torch: bool  # torch.cuda imports torch.cuda.um (the patched __init__)


PATHS = [
    UmPath("2.6.0", "libc10_cuda.so", imported_by_torch=True),
    UmPath("2.11.0", "libtorch_um.so", imported_by_torch=True),
]


@pytest.fixture(scope="module", params=PATHS, ids=lambda p: p.version.replace(".", "_"))
def um(
    request: pytest.FixtureRequest, build_wheel: Build, install_wheel: Install
) -> tuple[UmPath, Path]:
    path: UmPath = request.param
    return path, install_wheel(build_wheel(path.version))


# Runs in the venv: everything CPU-safe that torch.cuda.um offers, and whether CUDA stayed
# uninitialised after each step.
API_PROBE = r"""
import json, os, sys, torch
out = {"version": torch.__version__, "cuda_available": torch.cuda.is_available(),
       "um_imported_by_torch": "torch.cuda.um" in sys.modules,
       "init_after_import": torch.cuda.is_initialized()}
import torch.cuda.um as um
with open("/proc/self/maps") as f:
    out["engine_mapped"] = sorted({os.path.basename(l.split()[-1]) for l in f if "libtorch_um" in l})
out.update(available=um.is_available(), engine=um.engine_library(), enabled=um.is_enabled(),
           injection=um.injection_info(), defaults=um.get_config())

um.configure(max_managed="8GiB", device_budget="50%", host_headroom=1 << 30, prefetch=False)
out["kwargs"] = um.get_config()
um.configure("enabled:False, max_managed:none ,device_budget:70GiB,host_headroom:512MiB,prefetch:1")
out["text"] = um.get_config()
out["enabled_after_text"] = um.is_enabled()
um.set_max_managed(3 << 30); um.set_device_budget("12.5%"); um.set_host_headroom("1.5G")
out["setters"] = um.get_config()
um.set_max_managed(None); um.configure(enabled=True)
out["reset"] = um.get_config()
um.configure(predict_copy_sms=16)
out["copy_sms"] = um.get_config()["predict_copy_sms"]
um.configure("predict_copy_sms:0")
out["copy_sms_text"] = um.get_config()["predict_copy_sms"]
um.configure(predict_copy_sms="auto")
out["copy_sms_auto"] = um.get_config()["predict_copy_sms"]
um.configure(predict_copy_kernel="lean")
out["copy_kernel"] = um.get_config()["predict_copy_kernel"]
um.configure("predict_copy_kernel:foreach")
out["copy_kernel_text"] = um.get_config()["predict_copy_kernel"]
um.configure(predict_stage_kernel="lean")
out["stage_kernel"] = um.get_config()["predict_stage_kernel"]
um.configure("predict_stage_kernel:foreach")
out["stage_kernel_text"] = um.get_config()["predict_stage_kernel"]

bad = {}
for conf in json.loads(sys.argv[1]):
    before = um.get_config()
    try:
        um.configure(conf)
        bad[conf] = None
    except ValueError as e:
        bad[conf] = str(e)
    assert um.get_config() == before, (conf, before, um.get_config())  # all or nothing
out["bad"] = bad
pybad = {}
for name, kwargs in {"bool_enabled": {"enabled": "yes"}, "negative": {"max_managed": -1},
                     "bool_size": {"host_headroom": True}, "float_size": {"device_budget": 1.5},
                     "str_predict": {"predict": "yes"},
                     "small_lookahead": {"predict_lookahead": "4KiB"},
                     "bool_copy_sms": {"predict_copy_sms": True},
                     "int_copy_kernel": {"predict_copy_kernel": 1},
                     "bool_stage_kernel": {"predict_stage_kernel": True}}.items():
    try:
        um.configure(**kwargs)
        pybad[name] = None
    except (TypeError, ValueError) as e:
        pybad[name] = type(e).__name__
out["pybad"] = pybad
out["predict_stats"] = um.predict_stats()  # nothing ran under it: empty

cpu = torch.ones(4)
st = um.stats()
# A struct_size too small to hold struct_size itself is refused, and nothing is written.
import ctypes
raw = (ctypes.c_uint8 * 16)(*([4, 0, 0, 0, 0, 0, 0, 0] + [0xAB] * 8))
got = um._lib.torch_um_get_stats(0, ctypes.cast(raw, ctypes.POINTER(um._Stats)))
out["tiny_struct"] = [got, list(raw)]
# The engine's copy kernel (HostCopy.h) cannot be had without a GPU: no handle, a reason.
err = ctypes.create_string_buffer(256)
fn = um._lib.torch_um_copy_function(0, err, 256)
out["copy_function"] = [fn, err.value.decode()]
out.update(stats=st, stats_cpu_device=um.stats(0) == st, is_managed=um.is_managed(cpu),
           prefetch=um.prefetch(cpu), advise=um.advise([cpu], "read_mostly"),
           placement=list(um.placement(cpu)),
           where_bad_kind=um._lib.torch_um_where(ctypes.c_void_p(0), 1, 4),
           where_unknown=um._lib.torch_um_where(ctypes.c_void_p(4096), 1 << 20, 0))
try:
    um.advise(cpu, "sideways")
    out["bad_advice"] = None
except ValueError as e:
    out["bad_advice"] = str(e)
# Without a GPU, managed_host() falls back to ordinary memory, counted; move_ checks first.
with um.managed_host():
    big = torch.ones(1 << 20)
out["host_scope"] = {"managed": um.is_managed(big), "sum": float(big.sum()),
                     "fallbacks": um.stats()["um.host_fallbacks"]}
move_bad = {}
for name, call in (("copy_not_bool", lambda: um.move_(cpu, "cpu", copy=1)),
                   ("not_tensors", lambda: um.move_([cpu, 3], "cpu")),
                   ("bad_device", lambda: um.move_(cpu, "meta")),
                   ("autograd", lambda: um.move_(torch.ones(2, requires_grad=True) * 2, "cpu"))):
    try:
        call()
        move_bad[name] = None
    except (TypeError, ValueError) as e:
        move_bad[name] = f"{type(e).__name__}: {e}"
out["move_bad"] = move_bad
out["move_same_device"] = um.move_(cpu, "cpu") is cpu and cpu.device.type == "cpu"
# managed_host() patched Module.to/.cuda; CPU and dtype moves are the stock ones.
lin = torch.nn.Linear(4, 4)
out["module_to"] = [str(lin.to("cpu").weight.dtype), str(lin.to(torch.float64).weight.dtype),
                    torch.nn.Module.to.__doc__ is not None]
um.reset_peak()
out["summary"] = um.summary()
try:
    um.summary("cpu")
    out["summary_cpu"] = None
except ValueError as e:
    out["summary_cpu"] = str(e)
# Note [UM counters where tools look for memory]: wrapped once at import, upstream's {}
# before CUDA is initialised, and reading them initialises nothing.
out["memory_stats"] = [torch.cuda.memory_stats_as_nested_dict(), dict(torch.cuda.memory_stats()),
                       getattr(torch.cuda.memory_summary, "_um_counters", False),
                       torch.cuda.memory_stats_as_nested_dict
                       is torch.cuda.memory.memory_stats_as_nested_dict]
out["init_at_end"] = torch.cuda.is_initialized()
print(json.dumps(out))
"""

BAD = {
    # conf -> what the message must contain (besides the common prefix)
    "bogus:1": ["unknown key 'bogus'", KEYS, "PYTORCH_CUDA_ALLOC_CONF"],
    "expandable_segments:True": ["unknown key 'expandable_segments'", KEYS],
    "enabled:maybe": ["'enabled' takes True or False, got 'maybe'"],
    "host_copy_kernel:1.5": ["'host_copy_kernel' takes True or False, got '1.5'"],
    "pageable_copy_cpu:yes": ["'pageable_copy_cpu' takes True or False, got 'yes'"],
    "host_copy_cpu_share:0.95": ["'host_copy_cpu_share'", "from 0 (none) to 0.9", "got '0.95'"],
    "host_copy_cpu_share:-0.1": ["'host_copy_cpu_share'", "got '-0.1'"],
    "prefetch:yes": ["'prefetch' takes True or False, got 'yes'"],
    "max_managed:12XB": [
        "'max_managed' takes a size such as 512MiB, 8GiB or 1073741824, got '12XB'"
    ],
    "host_headroom:-1GiB": ["'host_headroom' takes a size", "got '-1GiB'"],
    "device_budget:lots": ["'device_budget' takes a size", "got 'lots'"],
    "device_budget:0%": ["'device_budget' as a percentage must lie in (0, 100], got '0%'"],
    "device_budget:150%": ["'device_budget' as a percentage must lie in (0, 100], got '150%'"],
    "device_budget:-5%": ["must lie in (0, 100], got '-5%'"],
    "max_managed": ["expected key:value, got 'max_managed'", KEYS],
    "host_alloc:pinned": ["'host_alloc' takes default", "got 'pinned'"],
    "policy:fifo": ["'policy' takes lru (residency", "or static (a segment", "got 'fifo'"],
    "host_alloc_min:big": ["'host_alloc_min' takes a size", "got 'big'"],
    "predict:often": ["'predict' takes True or False, got 'often'"],
    "predict_lookahead:4096": ["'predict_lookahead'", "at least 1MiB, got '4096'"],
    "predict_copy_sms:half": ["'predict_copy_sms' takes auto, 0", "got 'half'"],
    "predict_copy_sms:2.5": ["'predict_copy_sms' takes auto", "got '2.5'"],
    "predict_copy_kernel:cuda": ["'predict_copy_kernel' takes foreach", "or lean", "got 'cuda'"],
    "predict_stage_kernel:memcpy": [
        "'predict_stage_kernel' takes foreach (one torch._foreach_copy_",
        "or lean",
        "got 'memcpy'",
    ],
    # a bad item after a good one: nothing applies (the probe checks get_config is unchanged)
    "enabled:False,prefetch:nope": ["'prefetch' takes True or False, got 'nope'"],
}


@pytest.fixture(scope="module")
def api(um: tuple[UmPath, Path]) -> dict[str, Any]:
    """One run of API_PROBE in the venv, with the bad configurations of BAD."""
    _, venv = um
    code = f"import sys; sys.argv[1:] = [{json.dumps(list(BAD))!r}]\n{API_PROBE}"
    got: dict[str, Any] = probe(venv, code)
    return got


def test_import_leaves_cuda_alone(um: tuple[UmPath, Path], api: dict[str, Any]) -> None:
    path, _ = um
    assert api["version"] == f"{path.version}+um"
    assert api["cuda_available"] is False
    assert api["init_after_import"] is False
    assert api["init_at_end"] is False  # after every call below
    assert api["um_imported_by_torch"] is path.imported_by_torch


def test_engine_is_found_and_on(um: tuple[UmPath, Path], api: dict[str, Any]) -> None:
    path, venv = um
    assert api["available"] is True and api["enabled"] is True
    engine = Path(api["engine"])
    assert engine.name == path.engine and engine.parent.name == "lib"
    assert engine.is_relative_to(venv.parent.parent)  # the venv's torch/lib, not elsewhere
    assert api["defaults"] == DEFAULTS
    if path.engine == "libtorch_um.so":  # inject: loaded by the patched torch/__init__.py
        assert api["engine_mapped"] == ["libtorch_um.so"]
        assert api["injection"]["interposed"] == 1
        assert api["injection"]["attached"] == 0  # attaches when CUDA initialises
        assert api["injection"]["segment_allocs"] == 0
    else:
        assert api["engine_mapped"] == []
        assert api["injection"] == {}


def test_configure_get_config_round_trip(api: dict[str, Any]) -> None:
    assert api["kwargs"] == {
        "enabled": "True",
        "max_managed": str(8 << 30),
        "device_budget": "50%",
        "host_headroom": str(1 << 30),
        "prefetch": "False",
        **RESIDENCY,
    }
    assert api["text"] == {
        "enabled": "False",
        "max_managed": "none",
        "device_budget": str(70 << 30),
        "host_headroom": str(512 << 20),
        "prefetch": "True",
        **RESIDENCY,
    }
    assert api["enabled_after_text"] is False
    assert api["setters"] == {
        "enabled": "False",
        "max_managed": str(3 << 30),
        "device_budget": "12.5%",
        "host_headroom": str(3 << 29),
        "prefetch": "True",
        **RESIDENCY,
    }
    assert api["reset"] == {**api["setters"], "enabled": "True", "max_managed": "none"}
    assert (api["copy_sms"], api["copy_sms_text"], api["copy_sms_auto"]) == ("16", "0", "auto")
    assert (api["copy_kernel"], api["copy_kernel_text"]) == ("lean", "foreach")
    assert (api["stage_kernel"], api["stage_kernel_text"]) == ("lean", "foreach")


@pytest.mark.parametrize("conf", list(BAD))
def test_bad_input_is_a_value_error_naming_it(api: dict[str, Any], conf: str) -> None:
    message = api["bad"][conf]
    assert message is not None, f"configure({conf!r}) was accepted"
    assert message.startswith("unified memory configuration: "), message
    for part in BAD[conf]:
        assert part in message, message


def test_python_level_argument_checks(api: dict[str, Any]) -> None:
    assert api["pybad"] == {
        "bool_enabled": "TypeError",
        "negative": "ValueError",
        "bool_size": "TypeError",
        "float_size": "TypeError",
        "str_predict": "TypeError",
        "small_lookahead": "ValueError",  # the engine's message: at least 1MiB
        "bool_copy_sms": "TypeError",
        "int_copy_kernel": "TypeError",
        "bool_stage_kernel": "TypeError",
    }
    assert api["predict_stats"] == {}  # no forward ran past a budget


def test_cpu_safe_helpers(api: dict[str, Any]) -> None:
    stats = api["stats"]
    assert stats["um.enabled"] == 1 and stats["um.policy_lru"] == 1
    assert len(stats) == 79 and all(isinstance(v, int) for v in stats.values())
    flags = ("um.enabled", "um.policy_lru")
    assert {k: v for k, v in stats.items() if k not in flags} == dict.fromkeys(
        (k for k in stats if k not in flags), 0
    )
    assert api["stats_cpu_device"] is True
    assert api["copy_function"] == [None, "cannot make the device current"]
    assert api["tiny_struct"] == [-1, [4, 0, 0, 0, 0, 0, 0, 0] + [0xAB] * 8]
    assert api["is_managed"] is False
    assert api["prefetch"] == 0 and api["advise"] == 0  # CPU tensors are skipped
    assert api["placement"] == [0, 0, 0, 0]  # and count nothing where they are
    assert api["where_bad_kind"] == -1 and api["where_unknown"] == 0
    assert "unknown advice 'sideways'" in api["bad_advice"]


def test_memory_stats_wrapped_and_unchanged_without_a_gpu(api: dict[str, Any]) -> None:
    assert api["memory_stats"] == [{}, {}, True, True]
    assert api["init_at_end"] is False


def test_summary_without_a_gpu(api: dict[str, Any]) -> None:
    text = api["summary"]
    assert text.startswith("torch.cuda.um summary, device 0\n  engine       on; policy lru")
    assert "not resolved yet: the device has not been used" in text
    assert "nothing ran past a budget under it yet" in text
    assert "notes" not in text  # no counter recorded anything
    assert "a CUDA device is required here, not 'cpu'" in api["summary_cpu"]


def test_managed_host_and_move_without_a_gpu(api: dict[str, Any]) -> None:
    # The scope's allocation asked for managed memory, found no device and fell back.
    assert api["host_scope"] == {"managed": False, "sum": float(1 << 20), "fallbacks": 1}
    bad = api["move_bad"]
    assert bad["copy_not_bool"] == "TypeError: copy must be a bool, got int"
    assert bad["not_tensors"] == "TypeError: expected tensors, got int"
    assert bad["bad_device"] == "ValueError: unified memory is for CUDA devices, not 'meta'"
    assert bad["autograd"].startswith("ValueError: torch.cuda.um.move_: tensor 0 was computed by")
    assert api["move_same_device"] is True
    assert api["module_to"] == ["torch.float32", "torch.float64", True]


BAD_ENV_PROBE = r"""
import json, torch
import torch.cuda.um as um
out = {"available": um.is_available(), "enabled": um.is_enabled(),
       "sum": float(torch.arange(4.0).sum())}
for name, call in (("get_config", um.get_config),
                   ("configure", lambda: um.configure(prefetch=False)),
                   ("stats", um.stats)):
    try:
        call()
        out[name] = None
    except ValueError as e:
        out[name] = str(e)
out["init"] = torch.cuda.is_initialized()
print(json.dumps(out))
"""


def test_bad_environment_fails_at_first_use_not_at_import(um: tuple[UmPath, Path]) -> None:
    """PYTORCH_CUDA_UM_CONF is parsed when the engine is first used, not by ``import torch``:
    the import and CPU work succeed. Then every call that needs the settings raises
    ValueError naming the variable, the key and the value, and keeps raising (the engine is
    never set up, so ``configure`` cannot repair it: fix the variable). ``is_enabled()``
    reports False. On a GPU the first CUDA allocation fails the same way."""
    _, venv = um
    got = probe(venv, BAD_ENV_PROBE, {"PYTORCH_CUDA_UM_CONF": "prefetch:True,max_managed:lots"})
    assert got["available"] is True and got["enabled"] is False
    assert got["sum"] == 6.0 and got["init"] is False
    expected = (
        "PYTORCH_CUDA_UM_CONF: 'max_managed' takes a size such as 512MiB, 8GiB or "
        "1073741824, got 'lots'."
    )
    assert got["get_config"] == expected
    assert got["configure"] == expected
    assert got["stats"] == expected


def test_good_environment_is_read(um: tuple[UmPath, Path]) -> None:
    _, venv = um
    code = "import json, torch, torch.cuda.um as um; print(json.dumps([um.is_enabled(), um.get_config()]))"
    enabled, config = probe(
        venv, code, {"PYTORCH_CUDA_UM_CONF": "enabled:False,max_managed:1GiB,device_budget:40%"}
    )
    assert enabled is False
    assert config == {
        **DEFAULTS,
        "enabled": "False",
        "max_managed": str(1 << 30),
        "device_budget": "40%",
    }


EMPTY_CACHE_PROBE = r"""
import json, torch
import torch.cuda.um as um
original = torch.cuda.empty_cache

class Streamer:  # stands in for _um_weights.Streamer: counts the calls that drop its rings
    dropped = 0

    def drop_rings(self):
        Streamer.dropped += 1

um._patch_empty_cache()
um._patch_empty_cache()  # made again: still one wrapper
um._streamer = Streamer()
torch.cuda.empty_cache()
torch.cuda.memory.empty_cache()
f = torch.cuda.empty_cache
print(json.dumps({"dropped": Streamer.dropped, "same": f is torch.cuda.memory.empty_cache,
                  "wraps_stock": f.__wrapped__ is original, "name": f.__name__,
                  "doc": f.__doc__ == original.__doc__, "init": torch.cuda.is_initialized()}))
"""


def test_empty_cache_also_drops_the_streamers_rings(um: tuple[UmPath, Path]) -> None:
    """Once the weight streamer exists, ``torch.cuda.empty_cache`` (under either name) first
    drops its rings (Note [Weight streaming]), then does what stock does; wrapped once, with
    stock's name and docstring, and without initialising CUDA."""
    _, venv = um
    got = probe(venv, EMPTY_CACHE_PROBE)
    assert got == {
        "dropped": 2,
        "same": True,
        "wraps_stock": True,
        "name": "empty_cache",
        "doc": True,
        "init": False,
    }


# The lean copy kernel, a stand-in for the probes below: "strided" is a pair it does not
# apply to, "broken" one whose launch fails.
LEAN_STAND_IN = r"""
class Lean:
    def __init__(self):
        self.copied = []
    def copy(self, dst, src, stream, blocks):
        if src == "strided":
            return False
        if src == "broken":
            raise RuntimeError("cuLaunchKernel of the lean copy failed (CUresult 700)")
        self.copied.append([dst, src, stream, blocks])
        return True
"""


COPY_STREAM_PROBE = r"""
import json, warnings, torch
from torch.cuda import _um_copy, _um_streams, _um_weights

def no_green(device, sms):
    raise RuntimeError("no green contexts here")

# No GPU here: the lean copy kernel and the green context fail as without NVRTC and on an
# old driver, and the plain stream is a stand-in.
_um_copy.copier = lambda device: None
_um_copy.failures[0] = "RuntimeError: no NVRTC here"
_um_streams._make_green = no_green
_um_weights.side_stream = _um_streams.side_stream = lambda device, role: f"plain:{device}:{role}"
_um_weights.auto_copy_sms = lambda device: 16  # an H200's eighth
st = _um_weights.Streamer(lambda d: (0, 0, 0), lambda ts: None, 1 << 30, 1 << 30, lambda ts: None)
st.copy_lean = True  # predict_copy_kernel:lean, the default, which cannot be had here either
out = {}
for setting in (24, 0):
    st.copy_sms = setting
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, blocks = st._copy_stream(0)
        again, _ = st._copy_stream(0)  # kept: no second attempt, no second warning
    out[str(setting)] = {"stream": got, "again": again, "sms": st.stats["copy_sms"], "lean": blocks,
                         "warnings": [str(w.message) for w in caught]}
out["failures"] = {str(k): v for k, v in _um_streams.green_failures.items()}

# A lean copy kernel (LEAN_STAND_IN): auto takes its 2 SMs, a count by name that many, 0 none.

class Side:
    cuda_stream = 77

lean = Lean()
del _um_copy.failures[0]
_um_copy.copier = lambda device: None if device in _um_copy.failures else lean
st = _um_weights.Streamer(lambda d: (0, 0, 0), lambda ts: None, 1 << 30, 1 << 30, lambda ts: None)
# Not asked for (predict_copy_kernel:foreach; lean is the default): foreach, though the
# kernel is there.
st.copy_lean = False
out["foreach_asked"] = list(st._copy_stream(0))
st.copy_lean = True
out["lean"] = {}
for setting in (-1, 24, 0):
    st.copy_sms = setting
    stream, blocks = st._copy_stream(0)
    out["lean"][str(setting)] = [stream, blocks, st.stats["copy_sms"]]
st.copy_sms = -1
st._copy_stream(0)
# One copied, one strided (left to foreach), one whose launch fails: it and all after it go
# to foreach, the kernel is given up with a warning, and the stream is picked again.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rest = st._lean(0, Side(), 2, ["d1", "d2", "d3", "d4"], ["p1", "strided", "broken", "p4"])
out["rest"] = rest
out["copied"] = lean.copied
out["lean_copies"] = st.stats["lean_copies"]
out["lean_warnings"] = [str(w.message) for w in caught]
out["after_failure"] = list(st._copy_stream(0))
# configure() reaches a streamer that already exists at once, not at the next hook install.
import torch.cuda.um as um
um._streamer = st
um.configure(predict_copy_sms=8, predict_copy_kernel="foreach")
out["configured"] = [st.copy_sms, st.copy_lean]
um.configure("predict_copy_sms:auto")
out["configured_auto"] = st.copy_sms
out["init"] = torch.cuda.is_initialized()
print(json.dumps(out))
"""


SENT_AGAIN_PROBE = r"""
import json, types, torch
from torch.cuda import _um_plan, _um_weights

# Four calls of 64 KiB weights, streamed from a record whose target moves: all of them,
# then half (the others are read in place, so back on the device), then all again.
layers = [torch.nn.Linear(128, 128, bias=False) for _ in range(4)]
calls = [_um_weights._Call(m, [("weight", m.weight)]) for m in layers]
target = _um_plan.StreamTarget(margin=0)
record = _um_weights._Record(torch.nn.Sequential(*layers), calls, target)
sends = []  # per send, the layers whose weights went to host RAM
def send(tensors):
    sends.append(sorted(i for i, m in enumerate(layers) for t in tensors if t is m.weight))
st = _um_weights.Streamer(lambda d: (0, 0, 0, 0), send, 1 << 30, 1 << 30, lambda ts: None)
out = []
for nbytes in (4 << 16, 2 << 16, 4 << 16, 4 << 16):
    target.bytes = nbytes
    picked = record.plan(1 << 30)
    before = len(sends)
    st._send_new(types.SimpleNamespace(record=record, plan=picked, device=0, sent=0))
    out.append({"streams": [i for i, ks in enumerate(picked) if ks], "sent": sends[before:]})
print(json.dumps(out))
"""


def test_parameters_back_in_the_plan_are_sent_again(um: tuple[UmPath, Path]) -> None:
    """Note [Sent again] (_um_weights.py): a parameter the plan stopped streaming is read
    in place, back on the device; when the target grows over it again it is sent to host
    RAM again, and only it; a plan that does not change sends nothing."""
    _, venv = um
    got = probe(venv, SENT_AGAIN_PROBE)
    assert got[0] == {"streams": [0, 1, 2, 3], "sent": [[0, 1, 2, 3]]}
    half = got[1]["streams"]
    assert len(half) == 2 and got[1]["sent"] == []
    dropped = sorted({0, 1, 2, 3} - set(half))
    assert got[2] == {"streams": [0, 1, 2, 3], "sent": [dropped]}
    assert got[3] == {"streams": [0, 1, 2, 3], "sent": []}


COMPILED_PROBE = r"""
import json, torch
import torch.cuda.um as um

net = torch.nn.Sequential(torch.nn.Linear(8, 8))
wrapped = torch.compile(net)  # the wrapper only: nothing is compiled before its first call
own = torch.nn.Linear(8, 8)
own.compile()
out = {"plain": um._compiled_module(net), "layer": um._compiled_module(net[0]),
       "wrapper": um._compiled_module(wrapped), "own_compile": um._compiled_module(own)}
um.configure(hooks=True, policy="lru")
um._pre_forward(net, ())
out["after_plain"] = um._compiled_forward_seen
out["hooks_wanted_before"] = um._hooks_wanted()
um._pre_forward(wrapped, ())
out["after_wrapper"] = um._compiled_forward_seen
out["stat"] = um.predict_stats().get("predict.compiled_model")
out["hooks_wanted"] = um._hooks_wanted()
um.configure(predict=True)  # starts the choice afresh
out["after_configure"] = [um._compiled_forward_seen, um._hooks_wanted()]
print(json.dumps(out))
"""


def test_a_compiled_model_takes_the_module_hooks_off(um: tuple[UmPath, Path]) -> None:
    """Note [A compiled model is driven by operators] (um.py): torch.compile's wrapper and
    a module whose compile() was called are compiled, their layers and plain modules are
    not; once a compiled module's forward is seen the hooks are no longer wanted and
    predict_stats() says so, until configure() is called again."""
    _, venv = um
    got = probe(venv, COMPILED_PROBE)
    assert got == {
        "plain": False,
        "layer": False,
        "wrapper": True,
        "own_compile": True,
        "after_plain": False,
        "hooks_wanted_before": True,
        "after_wrapper": True,
        "stat": 1,
        "hooks_wanted": False,
        "after_configure": [False, True],
    }


PROGRAM_PROBE = r"""
import json, torch
from torch.cuda import _um_program

calls = []
_um_program.wrap_backward(lambda: calls.append("begin"), lambda: calls.append("end"))
w = torch.randn(4, 4, requires_grad=True)
out = {}
for step in range(2):
    calls.clear()
    loss = (torch.randn(2, 4) @ w).relu().sum()
    calls.append("forward")
    loss.backward()  # Tensor.backward goes through torch.autograd.backward
    out[f"step{step}"] = list(calls)
calls.clear()
x = torch.randn(2, 4)
(g,) = torch.autograd.grad((x @ w).sum(), [w])
out["grad"] = list(calls)
out["grad_right"] = torch.allclose(g, x.t() @ torch.ones(2, 4))  # what it returns is grad's
calls.clear()
try:
    torch.autograd.backward(torch.zeros(()))  # no graph: raises, through the wrapper
except RuntimeError:
    out["raised"] = list(calls)
print(json.dumps(out))
"""


def test_program_forwards_are_begun_and_ended_by_backward(um: tuple[UmPath, Path]) -> None:
    """Note [A program's forward between two backwards] (_um_program.py): once wrapped,
    torch.autograd.backward and grad end the open forward as they are called and begin the
    next as they return, also when they raise, and still do their work."""
    _, venv = um
    got = probe(venv, PROGRAM_PROBE)
    assert got == {
        "step0": ["forward", "end", "begin"],
        "step1": ["forward", "end", "begin"],
        "grad": ["end", "begin"],
        "grad_right": True,
        "raised": ["end", "begin"],
    }


PROGRAM_RUN_PROBE = r"""
import json, torch
from torch.cuda import _um_predict as P

# no GPU here: nothing is being captured, device 0, no cache to give back
torch.cuda.current_device = lambda: 0
torch.cuda.is_current_stream_capturing = lambda: False
torch.cuda.empty_cache = lambda: None
ag = torch._C._autograd
out = {"has_top": hasattr(ag, "_top_saved_tensors_default_hooks")}
if out["has_top"]:
    off = P.Offloader(lambda device: (0, 0), lambda: 1 << 30, 1 << 30, 100)
    ours = lambda: (ag._top_saved_tensors_default_hooks(False) or (None,))[0] == off.pack
    off.begin_program()  # programs off: nothing begins
    out["off"] = [off.current() is None, ours()]
    off.programs = True
    off.begin_program()
    run = off.current()
    out["begun"] = [run is not None and run.program, ours()]
    off.begin_program()  # one is open: no second
    out["once"] = off.current() is run and off.stats["program_forwards"] == 1
    w = torch.randn(4, 4, requires_grad=True)  # a leaf: its saves, and its views', stay
    h = w * 2
    out["leaves"] = [P._of_a_leaf(t) for t in (w, w.t(), h, h.t())]
    off.end_program()
    out["ended"] = [off.current() is None, ours(), off.stats["forwards"]]
    # Left open when a module's forward begins (the module hooks came back): closed first,
    # and the module's forward gets the offload's hooks, not the program's mistaken for the
    # program's own.
    off.begin_program()
    module = torch.nn.Linear(2, 2)
    fwd = off._begin(module)
    out["module_after_program"] = [fwd is not None and not fwd.program, ours()]
    if fwd is not None:
        off._end(fwd)
    # A backward called under the program's own hooks (inside save_on_cpu): the forward's
    # end leaves theirs, and ours beneath them, which the next forward's begin pops.
    off.begin_program()
    ag._push_saved_tensors_default_hooks(lambda t: t, lambda t: t)
    off.end_program()
    ag._pop_saved_tensors_default_hooks()
    stale = ours()
    fwd = off._begin(module)
    out["stale_popped"] = [stale, fwd is not None]
    if fwd is not None:
        off._end(fwd)
    # Planned at its first save, not at its begin: the buffers being made ahead are waited
    # for there (Note [A program's forward is planned at its first save]).
    import threading, time
    warm = threading.Thread(target=time.sleep, args=(0.5,))
    warm.start()
    off._warming = warm
    t0 = time.perf_counter()
    off.begin_program()
    began = time.perf_counter() - t0
    pending = off.current() is P._PENDING
    x = torch.randn(4, 4, requires_grad=True)
    y = (x * 2).sin()  # sin saves its input: the forward's first save
    run = off.current()
    out["planned_at_first_save"] = [
        began < 0.25, pending, not warm.is_alive(), run is not P._PENDING and run.program
    ]
    off.end_program()
    off.begin_program()  # a program forward with no save: never planned, its hooks come off
    off.end_program()
    out["unplanned_ended"] = [off.current() is None, ours(), off.stats["program_forwards"]]
    out["stack_clean"] = ag._top_saved_tensors_default_hooks(False) is None
print(json.dumps(out))
"""


def test_a_program_forward_keeps_the_hooks_stack_clean(um: tuple[UmPath, Path]) -> None:
    """Offloader.begin_program / end_program (Note [A program's forward between two
    backwards], _um_program.py): nothing begins while program forwards are off; one begins
    and pushes the offload's saved-tensor hooks, once; a leaf's saves (a view's too) stay,
    an activation's do not; its end pops
    them; a program forward left open when a module's forward begins is closed first, so
    that the module's forward is offloaded; it is planned at its first save, where it waits
    for the buffers made ahead, not at its begin, and one with no save is never planned; the
    stack is as it was. torch 2.6, which cannot tell whose hooks are on top, gets none of
    it."""
    _, venv = um
    got = probe(venv, PROGRAM_RUN_PROBE)
    if not got["has_top"]:
        assert got == {"has_top": False}
        return
    assert got == {
        "has_top": True,
        "off": [True, False],
        "begun": [True, True],
        "once": True,
        "leaves": [True, True, False, False],
        "ended": [True, False, 0],
        "module_after_program": [True, True],
        "stale_popped": [True, True],
        "planned_at_first_save": [True, True, True, True],
        "unplanned_ended": [True, False, 5],
        "stack_clean": True,
    }


def test_copy_stream_falls_back_and_says_why(um: tuple[UmPath, Path]) -> None:
    """Note [Lean copies], Note [Copies on few SMs]: where neither the lean copy kernel
    (asked for) nor a green context can be had, the weight streamer's copies take the plain
    stream; a count the user asked for by name (not auto, not 0) warns once, naming the
    setting and both reasons; the stream is kept per setting. The kernel is used unless
    foreach is asked for (predict_copy_kernel:foreach); auto and a count take that many
    blocks; a parameter it cannot copy goes to foreach, and a failed launch gives the
    kernel up with one warning, nothing left uncopied. configure() changes the setting of a streamer that
    exists at once."""
    _, venv = um
    got = probe(venv, LEAN_STAND_IN + COPY_STREAM_PROBE)
    asked = got["24"]
    assert asked["stream"] == asked["again"] == "plain:0:weights"
    assert asked["sms"] == 0
    assert len(asked["warnings"]) == 1, asked["warnings"]
    assert "predict_copy_sms:24" in asked["warnings"][0]
    assert "no green contexts here" in asked["warnings"][0]
    assert asked["lean"] == 0
    assert got["0"] == {"stream": "plain:0:weights", "again": "plain:0:weights", "sms": 0,
                        "lean": 0, "warnings": []}
    assert "no NVRTC here" in asked["warnings"][0]
    assert got["failures"] == {"(0, 24)": "RuntimeError: no green contexts here"}
    # Note [Lean copies]: the default; then the kernel's blocks, on the plain side stream.
    assert got["foreach_asked"] == ["plain:0:weights", 0]
    assert got["lean"] == {
        "-1": ["plain:0:weights", 2, 2],
        "24": ["plain:0:weights", 24, 24],
        "0": ["plain:0:weights", 0, 0],
    }
    assert got["copied"] == [["d1", "p1", 77, 2]]
    assert got["rest"] == [["d2", "d3", "d4"], ["strided", "broken", "p4"]]
    assert got["lean_copies"] == 1
    assert len(got["lean_warnings"]) == 1 and "CUresult 700" in got["lean_warnings"][0]
    assert got["after_failure"] == ["plain:0:weights", 0]  # foreach from now on
    assert (got["configured"], got["configured_auto"]) == ([8, False], -1)
    assert got["init"] is False


STAGE_COPY_PROBE = r"""
import contextlib, json, warnings, torch
from torch.cuda import _um_copy, _um_optim

calls = []
torch._foreach_copy_ = lambda dst, src: calls.append(["foreach", list(dst), list(src)])
torch.cuda.stream = lambda stream: contextlib.nullcontext()  # no GPU here


class Side:
    cuda_stream = 5

lean = Lean()
_um_copy.copier = lambda device: lean
st = _um_optim.Stager(lambda device: 0, lambda tensors: None)
out = {"default": st.copy_lean}
st._copy(0, Side(), ["a", "b"], ["x", "y"])
out["foreach"] = calls[:]
calls.clear()
st.copy_lean = True
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    st._copy(0, Side(), ["d1", "d2", "d3", "d4"], ["p1", "strided", "broken", "p4"])
out["copied"] = lean.copied
out["rest"] = calls[:]
out["lean_copies"] = st.stats["lean_copies"]
out["lean_after_failure"] = st.copy_lean
out["warnings"] = [str(w.message) for w in caught]
# configure() reaches a stager that already exists at once.
import torch.cuda.um as um
um._stager = st
um.configure(predict_stage_kernel="lean")
out["configured"] = st.copy_lean
out["blocks"] = {"auto": st.copy_blocks}
for sms in ("8", "0", "auto"):
    um.configure(predict_copy_sms=sms)
    out["blocks"][sms] = st.copy_blocks
um.configure("predict_stage_kernel:foreach")
out["configured_off"] = st.copy_lean
out["init"] = torch.cuda.is_initialized()
print(json.dumps(out))
"""


def test_optimizer_staging_copies_by_foreach_or_the_lean_kernel(um: tuple[UmPath, Path]) -> None:
    """Note [Optimizer state staging], "The copies' kernel": foreach by default, one launch
    for the chunk's pairs; under predict_stage_kernel:lean each pair by the lean kernel on
    its stream and 32 SMs (predict_copy_sms where that is a count), a pair it cannot copy by
    foreach, and a failed launch sends it and every pair after it to foreach with one
    warning and gives the kernel up, nothing left uncopied. configure() reaches a stager
    that exists at once."""
    _, venv = um
    got = probe(venv, LEAN_STAND_IN + STAGE_COPY_PROBE)
    assert got["default"] is False
    assert got["foreach"] == [["foreach", ["a", "b"], ["x", "y"]]]
    assert got["copied"] == [["d1", "p1", 5, 32]]
    assert got["rest"] == [["foreach", ["d2", "d3", "d4"], ["strided", "broken", "p4"]]]
    assert got["lean_copies"] == 1 and got["lean_after_failure"] is False
    assert got["blocks"] == {"auto": 32, "8": 8, "0": 32}
    assert len(got["warnings"]) == 1 and "CUresult 700" in got["warnings"][0]
    assert "optimizer state staging copies by foreach" in got["warnings"][0]
    assert (got["configured"], got["configured_off"]) == (True, False)
    assert got["init"] is False


WARM_PROBE = r"""
import json, threading, torch
from torch.cuda import _um_predict as P

calls = []
lock = threading.Lock()
real_empty = torch.empty

def fake_empty(n, dtype=None, pin_memory=False, **kw):  # no page-locked memory here
    with lock:
        calls.append([n, pin_memory, threading.current_thread() is threading.main_thread()])
    if n == 666:
        raise RuntimeError("cudaHostAlloc: out of memory")
    return real_empty(0, dtype=dtype)

torch.empty = fake_empty
# counters: 650 bytes evicted during the forward, no room left at its end
off = P.Offloader(lambda device: (650, 0), lambda: 10_000, 1 << 30, 100)
fwd = P._Forward(0, P.plan.PrefetchQueue(1 << 30, 0), set(), 0, 0)
fwd.saves = [(100, True), (200, False), (300, False), (400, False)]
fwd.plan.seen, fwd.plan.offloaded = 1000, 100
torch._C._autograd._push_saved_tensors_default_hooks(off.pack, off.unpack)  # as _begin did
off._end(fwd)  # opens the kept saves' window: nothing learnt yet
out = {"open": off._window is not None, "target_at_end": off.target.bytes}
off._learn(off._window)  # the target grows to 650: the next forward sends the first four saves
out.update(target=off.target.bytes, started=off._warming is not None, closed=off._window is None)
off._join_warming()
out["calls"] = sorted(calls)
out["warmed"], out["stats"] = off.warmed, off.stats["warmed_bytes"]
calls.clear()
off._start_warming([666, 10, 20, 30, 40])  # the first thread is refused at once
off._join_warming()
out["refused"] = sorted(c[0] for c in calls)
out["warmed_after"] = off.warmed

# A target no larger than what left this time warms nothing (and reads no host room).
rooms = []
off2 = P.Offloader(lambda device: (0, 0), lambda: rooms.append(1) or 10_000, 1 << 30, 100)
off2.target.bytes = 300
fwd = P._Forward(300, P.plan.PrefetchQueue(1 << 30, 0), set(), 0, 0)
fwd.saves = [(100, True), (200, True), (300, False)]
fwd.plan.seen, fwd.plan.offloaded = 600, 300
torch._C._autograd._push_saved_tensors_default_hooks(off2.pack, off2.unpack)
off2._end(fwd)
off2._learn(off2._window)
out["unchanged"] = {"started": off2._warming is not None, "room_reads": len(rooms)}

# The next forward's start waits for the buffers made ahead and counts them as cached:
# a target 900 past the last forward's 100, all of it made ahead, needs no host room.
torch.empty = real_empty
module = torch.nn.Linear(2, 2)
slow = threading.Event()
torch.empty = lambda n, dtype=None, pin_memory=False, **kw: slow.wait(0.5) or real_empty(0)
off3 = P.Offloader(lambda device: (0, 0), lambda: 0, 1 << 30, 100)
off3._target_of(module).bytes, off3.offloaded_last = 1000, 100
off3._start_warming([900])
warming = off3._warming
# no GPU here: the module's parameters are on the CPU, and nothing is being captured
torch.cuda.current_device = lambda: 0
torch.cuda.is_current_stream_capturing = lambda: False
fwd3 = off3._begin(module)
out["has_top"] = hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks")
if fwd3 is not None:
    torch._C._autograd._pop_saved_tensors_default_hooks()
    out["begin"] = {
        "joined": not warming.is_alive(),
        "target": fwd3.plan.target,
        "host_limited": off3.stats["host_limited"],
        "warmed_left": off3.warmed,
    }
print(json.dumps(out))
"""


def test_offloader_makes_the_next_forwards_host_buffers_ahead(um: tuple[UmPath, Path]) -> None:
    """Note [Host buffers made ahead]: at a forward's end the page-locked buffers the next
    forward will take and this one did not are made off the forward's thread and freed
    into the host allocator's cache; a refusal stops one thread, and only what was made
    counts; a target that does not grow makes none; the next forward's start waits for
    them and does not count them against the host room again."""
    _, venv = um
    got = probe(venv, WARM_PROBE)
    assert got["open"] is True and got["target_at_end"] == 0
    assert got["target"] == 650 and got["started"] is True and got["closed"] is True
    assert got["calls"] == [[200, True, False], [300, True, False], [400, True, False]]
    assert got["warmed"] == got["stats"] == 900
    assert got["refused"] == [10, 20, 30, 666]  # the thread of 666 never reached 40
    assert got["warmed_after"] == 900 + 60
    assert got["unchanged"] == {"started": False, "room_reads": 0}
    # the start waited, kept the whole target (no host room needed) and used the count up;
    # torch 2.6 gets no offload at all (Note [Saved-activation offload])
    begin = {"joined": True, "target": 1000, "host_limited": 0, "warmed_left": 0}
    assert got.get("begin") == (begin if got["has_top"] else None)


WINDOW_PROBE = r"""
import json, torch
from torch.cuda import _um_predict as P

state = {"evicted": 0, "room": 600}
out = {}

def offloader():
    return P.Offloader(lambda device: (state["evicted"], state["room"]), lambda: 0, 1 << 30, 100)

def forward_end(off):
    fwd = P._Forward(off.target.bytes, P.plan.PrefetchQueue(1 << 30, 0), set(), 0, 0)
    fwd.plan.seen = 4 << 20
    torch._C._autograd._push_saved_tensors_default_hooks(lambda t: t, lambda t: t)
    off._end(fwd)  # room 600 at the forward's end: past the margin of 100

# The backward's start is the peak: 300 bytes evicted and no room while it reads a kept save
off = offloader()
forward_end(off)
x = torch.randn(1 << 19, requires_grad=True)  # a 2 MiB save, kept
torch._C._autograd._push_saved_tensors_default_hooks(lambda t: t, off.unpack)
y = (x * x).sum()
torch._C._autograd._pop_saved_tensors_default_hooks()
state.update(evicted=300, room=0)
out["open_before"] = off._window is not None
y.backward()
out["backward"] = {"closed": off._window is None, "target": off.target.bytes}

# A save read outside a backward (grad_fn._saved_self runs the unpack hook): no error,
# the window stays open for a later close
state.update(evicted=0, room=600)
off3 = offloader()
forward_end(off3)
torch._C._autograd._push_saved_tensors_default_hooks(lambda t: t, off3.unpack)
z = x * x
torch._C._autograd._pop_saved_tensors_default_hooks()
out["read_outside"] = {"same": bool(z.grad_fn._saved_self.equal(x)), "open": off3._window is not None}

# The backward's first read of a save that left closes the window before any copy back
# (the rest of that read needs CUDA: stopped at its first CUDA call here)
class Stop(Exception):
    pass

def no_cuda(*args, **kwargs):
    raise Stop

torch.cuda.current_stream = no_cuda
state.update(evicted=0, room=0)
off5 = offloader()
forward_end(off5)
state.update(evicted=200, room=0)
left = P._Packed.__new__(P._Packed)
left.stored = P._Stored.__new__(P._Stored)
left.stored.device = torch.device("cpu")
try:
    off5.unpack(left)
except Stop:
    pass
out["first_left"] = {"closed": off5._window is None, "target": off5.target.bytes}

# A forward whose backward never comes: the next forward's end closes its window
state.update(evicted=0, room=600)
off2 = offloader()
off2.target.bytes = 400
forward_end(off2)
first = off2._window
forward_end(off2)
out["no_backward"] = {
    "first_closed": off2._window is not first and off2._window is not None,
    "target": off2.target.bytes,
}

# The window hands the target the forward's first save and its own target: what it learns
# holds for a forward of another size (Note [A target for each size of forward])
state.update(evicted=0, room=0)
off6 = offloader()
fwd = P._Forward(0, P.plan.PrefetchQueue(1 << 30, 0), set(), 0, 0, off6.target.for_forward)
for n in (4 << 20, 4 << 20):
    fwd.plan.offload(n)
torch._C._autograd._push_saved_tensors_default_hooks(lambda t: t, lambda t: t)
off6._end(fwd)
state.update(evicted=3 << 20)
off6._learn(off6._window)
out["sized"] = {
    "bytes": off6.target.bytes,
    "sizes": {str(k): v for k, v in off6.target.sizes.items()},
    "twice": off6.target.for_forward(8 << 20),
}
print(json.dumps(out))
"""


def test_the_target_learns_from_the_kept_saves_window(um: tuple[UmPath, Path]) -> None:
    """Note [The kept saves' window]: a forward's end opens it, a read of a kept save in
    the backward reads the room and asks the backward's end to close it (a read outside a
    backward asks nothing, and raises nothing), and the target
    learns then: from the least room seen and the evictions up to the close, not from the
    forward's end (where this room was 600, past the margin: the target would shrink). A
    window whose backward never came is closed by the next forward's end."""
    _, venv = um
    got = probe(venv, WINDOW_PROBE)
    assert got["open_before"] is True
    assert got["backward"] == {"closed": True, "target": 300}
    assert got["read_outside"] == {"same": True, "open": True}
    # the first read of a save that left: the evictions so far (200) are learnt then
    assert got["first_left"] == {"closed": True, "target": 200}
    # room 600 at both ends, no evictions: the target shrinks by 3/4 of 500
    assert got["no_backward"] == {"first_closed": True, "target": 400 - 375}
    # 8 MiB saved, the first 4 MiB, 3 MiB evicted: 5 MiB kept, so a forward of twice the
    # size offloads 16 - 5 MiB
    assert got["sized"] == {
        "bytes": 3 * MiB, "sizes": {str(4 * MiB): 8 * MiB}, "twice": 11 * MiB
    }


MODULES_PROBE = r"""
import json, torch
from torch.cuda import _um_predict as P

MiB = 1 << 20
state = {"evicted": 0}
# no GPU here: the modules' parameters are on the CPU, and nothing is being captured
torch.cuda.current_device = lambda: 0
torch.cuda.is_current_stream_capturing = lambda: False
off = P.Offloader(lambda device: (state["evicted"], 0), lambda: 1 << 40, 1 << 30, 100)
model, criterion = torch.nn.Linear(2, 2), torch.nn.MSELoss()
out = {"has_top": hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks"), "model": []}

def forward(module, saves, evicted):
    fwd = off._begin(module)  # closes the window of the forward before
    if fwd is None:
        return None
    for n in saves:
        fwd.plan.offload(n)
    state["evicted"] += evicted
    off._end(fwd)
    return fwd.plan.target

# loss = criterion(model(x), y), three steps: the model's saves evict 6 MiB until its
# target covers them; the criterion's 1 MiB fits
for _ in range(3):
    out["model"].append(forward(model, [4 * MiB] * 4, 6 * MiB if not out["model"] else 0))
    forward(criterion, [1 * MiB], 0)
print(json.dumps(out))
"""


def test_each_outermost_module_learns_its_own_target(um: tuple[UmPath, Path]) -> None:
    """A loss module called after the model is an outermost forward of its own: the
    model's target is learnt from the model's forwards, not from the criterion's small
    one (learnt from the latest forward, the model's second target read 15 MiB: its 16
    MiB of saves less the 1 MiB the criterion kept)."""
    _, venv = um
    got = probe(venv, MODULES_PROBE)
    if not got["has_top"]:
        assert got["model"] == [None] * 3  # torch 2.6: no offload at all
        return
    assert got["model"] == [0, 6 * MiB, 6 * MiB]


CHAIN_PROBE = r"""
import json, torch
from torch.cuda import _um_predict as P

MiB = 1 << 20
state = {"evicted": 0, "room": 0}
# no GPU here: the modules' parameters are on the CPU, and nothing is being captured
torch.cuda.current_device = lambda: 0
torch.cuda.is_current_stream_capturing = lambda: False
off = P.Offloader(lambda device: (state["evicted"], state["room"]), lambda: 1 << 40, 1 << 30, MiB)
model, criterion = torch.nn.Linear(2, 2), torch.nn.MSELoss()
ids = torch.zeros(2)  # a batch: no autograd history
logits = torch.ones(2, requires_grad=True) * 2  # the model's output: history
kept = torch.zeros(MiB)  # a save that stayed on the device, of 4 MiB
out = {"has_top": hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks"), "steps": []}

def forward(module, args, saves):
    fwd = off._begin(module, args)
    if fwd is None:
        return None
    for n in saves:
        fwd.plan.offload(n)
    off._end(fwd)
    return fwd

# Three steps of loss = criterion(model(ids), y): the forward ends with 10 MiB free; the
# backward's kept phase evicts 6 MiB with no room left; its first read of a save that
# left closes the window (Offloader.unpack), or the next step's start does
for step in range(3):
    state["room"] = 10 * MiB
    fwd = forward(model, (ids,), [4 * MiB] * 4)
    if fwd is None:
        break
    opened = off._window
    forward(criterion, (logits, ids), [1 * MiB])
    record = {"joined": off._window is opened and len(opened.parts) == 2}
    state["evicted"] += 6 * MiB if step == 0 else 0
    state["room"] = 0
    off._watch(kept)  # the backward reads a kept save: the room it reads is 0
    if step < 2:
        off._learn(off._window)
    record["targets"] = [off._target_of(model).bytes, off._target_of(criterion).bytes]
    out["steps"].append(record)
# what counts as history: a tensor made by recorded operations, at any depth of the
# positional arguments' containers
out["history"] = [
    P._has_history(args)
    for args in ((ids,), (logits,), ((ids, [logits]),), ({"x": ids, "y": {"z": logits}},),
                 (torch.ones(2, requires_grad=True),), ())
]
# a forward with no history ends the chain of the step before (its backward never came)
left = off._window
forward(model, (ids,), [4 * MiB] * 4)
out["closed_by_a_batch"] = left is not None and off._window is not left
print(json.dumps(out))
"""


def test_a_loss_module_joins_the_models_window(um: tuple[UmPath, Path]) -> None:
    """Note [A chain of forwards before one backward]: a loss module called on the model's
    output keeps the model's window open into the backward and shares it: the model's
    target learns the kept phase's 6 MiB of evictions and the loss module's stays 0. With
    the window closed at the loss module's start (checked by reverting), the model's
    target learnt from the forward's end alone (0: 10 MiB free) and the loss module's
    took its 1 MiB save. A forward on a fresh batch ends the chain; history is found in
    nested containers, not in a leaf tensor."""
    _, venv = um
    got = probe(venv, CHAIN_PROBE)
    if not got["has_top"]:
        assert got["steps"] == []  # torch 2.6: no offload at all
        return
    assert [s["joined"] for s in got["steps"]] == [True] * 3
    assert [s["targets"] for s in got["steps"]] == [[6 * MiB, 0]] * 3
    assert got["closed_by_a_batch"] is True
    # the batch, the model's output, the output in nested containers, a leaf, nothing
    assert got["history"] == [False, True, True, True, False, False]


CHAIN_CALLS_PROBE = r"""
import json, torch
from torch.cuda import _um_plan
from torch.cuda import _um_predict as P
from torch.nn.modules import module as nn_module

# no GPU here: the modules' parameters are on the CPU, and nothing is being captured
torch.cuda.current_device = lambda: 0
torch.cuda.is_current_stream_capturing = lambda: False
model, criterion = torch.nn.Linear(4, 4), torch.nn.MSELoss()
x, y = torch.randn(2, 4), torch.randn(2, 4)
out = {"has_top": hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks")}

def parts(code, call):
    # real module calls through the global hooks, as um.py installs them
    _um_plan.OutermostForward.call_code = code
    off = P.Offloader(lambda device: (0, 0), lambda: 0, 1 << 30, 100)
    handles = [
        nn_module.register_module_forward_pre_hook(off.enter),
        nn_module.register_module_forward_hook(off.exit, always_call=True),
    ]
    try:
        logits = model(x)
        call(logits)
        return len(off._window.parts) if off._window is not None else 0
    finally:
        for h in handles:
            h.remove()

code = nn_module.Module._call_impl.__code__
out["positional"] = parts(code, lambda logits: criterion(logits, y))
out["keyword"] = parts(code, lambda logits: criterion(input=logits, target=y))
out["no_history"] = parts(code, lambda logits: criterion(input=logits.detach(), target=y))
out["keyword_unknown_frame"] = parts(None, lambda logits: criterion(input=logits, target=y))
print(json.dumps(out))
"""


def test_a_loss_module_called_by_keyword_joins_the_chain_too(um: tuple[UmPath, Path]) -> None:
    """Through the real global hooks: a loss module given the model's output by position
    or by keyword (read from the module call's frame, ``call_kwargs``) joins the model's
    window (two parts); given a detached output, or by keyword where the call's frame is
    not known, it opens a window of its own (one part)."""
    _, venv = um
    got = probe(venv, CHAIN_CALLS_PROBE)
    calls = ("positional", "keyword", "no_history", "keyword_unknown_frame")
    if not got["has_top"]:
        assert [got[k] for k in calls] == [0] * 4  # torch 2.6: no offload, no window
        return
    assert (got["positional"], got["keyword"]) == (2, 2)
    assert (got["no_history"], got["keyword_unknown_frame"]) == (1, 1)


TRIM_PROBE = r"""
import json, torch
from torch.cuda import _um_predict as P

trims = []
torch.cuda.empty_cache = lambda: trims.append(1)
# no GPU here: the module's parameters are on the CPU, and nothing is being captured
torch.cuda.current_device = lambda: 0
torch.cuda.is_current_stream_capturing = lambda: False
module = torch.nn.Linear(2, 2)
off = P.Offloader(lambda device: (0, 0), lambda: 1 << 40, 1 << 30, 100)
out = {"has_top": hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks")}

def forward_start():
    if off._begin(module) is not None:
        torch._C._autograd._pop_saved_tensors_default_hooks()

forward_start()  # the first forward offloads nothing (target 0): the cache stays
out["first"] = len(trims)
off.target.bytes = 1000  # learnt from it
forward_start()
forward_start()
out["after"], out["stats"] = len(trims), off.stats["trims"]

# A loss module's target past 0 and the model's 0 (the hooks came on during the model's
# first forward): the loss module, chained to the model's open window, does not trim (the
# step's saves are alive), nor does the model's forward while it offloads nothing; the
# first step whose first forward offloads does
trims.clear()
off = P.Offloader(lambda device: (0, 0), lambda: 1 << 40, 1 << 30, 100)
criterion = torch.nn.MSELoss()
ids, logits = torch.zeros(2), torch.ones(2, requires_grad=True) * 2

def step(model_target):
    off._learn(off._window)  # the window closes (its backward's end), then the targets:
    off._target_of(module).bytes = model_target
    off._target_of(criterion).bytes = 1000
    counts = []  # the trims made by the end of each forward
    for part, args in ((module, (ids,)), (criterion, (logits, ids))):
        fwd = off._begin(part, args)
        if fwd is not None:
            off._end(fwd)
        counts.append(len(trims))
    return counts

out["chained"] = [step(0), step(0), step(1000), step(1000)]
print(json.dumps(out))
"""


def test_the_first_forward_to_offload_gives_the_cache_back_once(um: tuple[UmPath, Path]) -> None:
    """Note [The cache the first forward left]: the forward that starts with a target
    past 0 for the first time empties the allocator's cache, and no forward after it does;
    the first forward (target 0, the plain policy) does not; a forward chained to an open
    window never does, even with its own target past 0. Torch 2.6 offloads nothing."""
    _, venv = um
    got = probe(venv, TRIM_PROBE)
    if got["has_top"]:
        assert (got["first"], got["after"], got["stats"]) == (0, 1, 1)
        # a model's forward, then its loss module's joining the window: the chained one
        # never trims, the model's once its own target is past 0
        assert got["chained"] == [[0, 0], [0, 0], [1, 1], [1, 1]]
    else:
        assert (got["first"], got["after"], got["stats"]) == (0, 0, 0)
        assert got["chained"] == [[0, 0]] * 4


KEPT_PHASE_PROBE = r"""
import json, weakref, torch
from torch.cuda import _um_predict as P

off = P.Offloader(lambda device: (0, 600), lambda: 0, 1 << 30, 100)
pumps = []
off._pump = lambda queue, device: pumps.append(str(device))
queue = P.plan.PrefetchQueue(1 << 30, 0)
queue.add(lambda: None)  # a save that left, not brought back yet
fwd = P._Forward(0, queue, set(), 0, 0)
fwd.plan.seen = 4 << 20
torch._C._autograd._push_saved_tensors_default_hooks(lambda t: t, lambda t: t)
off._end(fwd)  # the window opens
off._latest = weakref.ref(queue)  # as the forward's start sets it

class OnDevice(torch.Tensor):  # a kept save as the pump sees one, on a CPU-only host
    is_cuda = True

kept = torch.randn(1 << 19).as_subclass(OnDevice)
out = {}
off.unpack(kept)  # a read of a kept save while the window is open
out["while_open"] = list(pumps)
off._learn(off._window)  # the first read of a save that left closes it
off.unpack(kept)
out["after_close"] = list(pumps)
print(json.dumps(out))
"""


def test_nothing_comes_back_while_the_kept_saves_are_read(um: tuple[UmPath, Path]) -> None:
    """Note [The kept saves' window]: a read of a kept save brings nothing back while the
    window is open (the room there is the kept saves' peak, and the window measures it);
    once it has closed, the same read pumps the prefetch queue."""
    _, venv = um
    got = probe(venv, KEPT_PHASE_PROBE)
    assert got == {"while_open": [], "after_close": ["cpu"]}


FORK_PROBE = r"""
import json, os, threading, time, weakref, torch
from torch.cuda import _um_streams as S

r, w = os.pipe()
made = []

class Event:  # stands in for torch.cuda.Event: says where it is destroyed
    def __init__(self):
        self.records = 0
        made.append(weakref.ref(self))
    def record(self, stream):
        self.records += 1
    def __del__(self):
        os.write(w, f"{os.getpid()}\n".encode())

class Stream:
    device_index = 0
    def wait_event(self, event):
        pass

torch.cuda.Event = Event
go, done = threading.Event(), threading.Event()

def autograd_like_thread():  # a thread that waits through the fork, as autograd's do
    S.wait_stream(Stream(), Stream())
    go.set()
    done.wait()

t = threading.Thread(target=autograd_like_thread)
t.start()
go.wait()
S.wait_stream(Stream(), Stream())  # this thread's own
child = os.fork()
if child == 0:
    time.sleep(0.2)  # the child's thread states are cleared at the fork; give it time
    os._exit(0)
os.waitpid(child, 0)
done.set()
t.join()
os.set_blocking(r, False)
try:
    destroyed_in = os.read(r, 4096).decode().split()
except BlockingIOError:  # nothing destroyed anywhere
    destroyed_in = []
alive = [e() for e in made if e() is not None]
out = {"events": len(alive), "records": sorted(e.records for e in alive)}
out["destroyed_in_child"] = str(child) in destroyed_in
print(json.dumps(out))
"""


def test_stream_wait_events_are_not_destroyed_in_a_forked_child(um: tuple[UmPath, Path]) -> None:
    """Note [One event a thread for stream waits]: the events of stream waits made on
    another thread (autograd's, in the offload's copies back) live in a module dict, not a
    thread-local, which a forked child (a DataLoader's worker) clears, destroying CUDA
    events where CUDA cannot be called; the child keeps what it inherited, unfreed."""
    _, venv = um
    got = probe(venv, FORK_PROBE)
    assert got == {"events": 2, "records": [1, 1], "destroyed_in_child": False}


ON_STREAM_PROBE = r"""
import json, torch
from torch.cuda import _um_streams as S

calls = []

class Fake:
    def __init__(self, name):
        self.stream_id, self.device_index, self.device_type = name, 0, 1

class Plain:  # stands in for torch.cuda.stream()'s context manager
    def __init__(self, stream):
        self.stream = stream
    def __enter__(self):
        calls.append(("enter", self.stream.stream_id))
    def __exit__(self, *exc):
        calls.append(("exit", self.stream.stream_id, exc[0].__name__ if exc[0] else None))

S._set_raw = lambda stream_id, device_index, device_type: calls.append(("set", stream_id))
S._get_device = lambda: 0
torch.cuda.stream = Plain
out = {}
with S.on_stream(Fake("side"), 0, Fake("compute")):
    calls.append(("work",))
out["same_device"], calls[:] = list(calls), []
try:
    with S.on_stream(Fake("side"), 0, Fake("compute")):
        raise ValueError("a launch failed")
except ValueError:
    pass
out["raised"], calls[:] = list(calls), []
with S.on_stream(Fake("side"), 1, Fake("compute")):  # the current device is another
    calls.append(("work",))
out["other_device"] = list(calls)
print(json.dumps(out))
"""


def test_on_stream_switches_raw_on_the_current_device_and_back_when_work_raises(
    um: tuple[UmPath, Path],
) -> None:
    """The weight streamer's copies are queued inside ``_um_streams.on_stream``: on the
    current device, two raw stream switches (to the side stream, back to the compute
    stream, also when the work raises); on another device, torch.cuda.stream()'s context
    manager, which switches the device too."""
    _, venv = um
    got = probe(venv, ON_STREAM_PROBE)
    assert got["same_device"] == [["set", "side"], ["work"], ["set", "compute"]]
    assert got["raised"] == [["set", "side"], ["set", "compute"]]
    assert got["other_device"] == [["enter", "side"], ["work"], ["exit", "side", None]]


LEAN_PIECES_PROBE = r"""
import ctypes, json, torch
from torch.cuda import _um_copy

# No GPU here: the copier's launch is a recorder with cuLaunchKernel's arguments.
calls, fail_at = [], [None]
def record(func, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
    d = ctypes.c_void_p.from_address(params[0]).value
    s = ctypes.c_void_p.from_address(params[1]).value
    n = ctypes.c_ulonglong.from_address(params[2]).value
    calls.append([d, s, n, gx, bx, stream])
    return 700 if len(calls) == fail_at[0] else 0

lean = object.__new__(_um_copy.LeanCopier)
lean._func, lean._launch = ctypes.c_void_p(1), record
src = torch.empty(1000003, dtype=torch.uint8)
dst = torch.empty(1000003, dtype=torch.uint8)
out = {"src": src.data_ptr(), "dst": dst.data_ptr(), "default": _um_copy.LAUNCH_BYTES}
for most in (0, 1 << 18, 100):
    _um_copy.LAUNCH_BYTES = most
    calls.clear()
    out[str(most)] = [lean.copy(dst, src, 5, 2), [list(c) for c in calls]]
_um_copy.LAUNCH_BYTES, fail_at[0] = 1 << 18, 3
calls.clear()
try:
    lean.copy(dst, src, 5, 2)
except RuntimeError as e:
    out["failed"] = [str(e), len(calls)]
out["init"] = torch.cuda.is_initialized()
print(json.dumps(out))
"""


def test_lean_copy_launches_cover_the_copy_in_pieces(um: tuple[UmPath, Path]) -> None:
    """Note [Lean copies]: a copy goes in one launch by default, or in launches of at most
    LAUNCH_BYTES (rounded down to 16 bytes) that cover it exactly, in order, each on the
    copier's blocks and the stream given; a launch that fails raises, naming its
    CUresult, after the launches before it."""
    _, venv = um
    got = probe(venv, LEAN_PIECES_PROBE)
    assert got["default"] == 0
    for most, step in (("0", 1000003), (str(1 << 18), 1 << 18), ("100", 96)):
        copied, calls = got[most]
        assert copied is True
        assert len(calls) == -(-1000003 // step), most
        at = 0
        for d, s, n, blocks, threads, stream in calls:
            assert (d, s) == (got["dst"] + at, got["src"] + at), (most, at)
            assert n == min(step, 1000003 - at)
            assert (blocks, threads, stream) == (2, 1024, 5)
            at += n
        assert at == 1000003
    message, launched = got["failed"]
    assert "CUresult 700" in message and launched == 3
    assert got["init"] is False


HOOK_SETTINGS_PROBE = r"""
import json, torch
import torch.cuda.um as um

def state():
    return [um._hooks_installed, len(um._hook_handles)]

# No GPU here: the engine reports pressure as a device past its budget would, and the
# hooks go on as the pressure watcher puts them on.
um._lib.torch_um_under_pressure = lambda: 1
um._install_hooks()
out = {"predict": state()}
handles = list(um._hook_handles)

def ddp():  # Note [DDP's buckets between steps]: watched for, and told of the steps
    return [um._ddp_type is not None, um._stager.seen is not None]

out["ddp"] = ddp()
um.configure(predict_ddp_buckets=False)
out["ddp_off"] = ddp() + [state() == out["predict"]]
um.configure(predict_ddp_buckets=True)
out["ddp_on"] = ddp() + [state() == out["predict"]]
handles = list(um._hook_handles)
um.configure(device_budget="50%")  # not a setting the hooks depend on: left alone
out["same_after_budget"] = um._hook_handles == handles
um.configure(predict=False)
out["predict_off"] = state()
um.configure("predict:True")
out["predict_on"] = state()
um.configure(hooks=False)
out["hooks_off"] = state()
um.configure(hooks=True)  # off already: putting them on is the watcher's job, at its poll
out["hooks_on"] = state()
out["init"] = torch.cuda.is_initialized()
print(json.dumps(out))
"""


def test_configure_changes_the_installed_hooks_at_once(um: tuple[UmPath, Path]) -> None:
    """Note [Use signals]: while the hooks are on, configure() of a setting that decides
    them (predict, predict_ddp_buckets, hooks, policy, enabled) replaces them at once with
    the set the new settings want, or takes them off; other settings leave them alone.
    predict_ddp_buckets alone switches the DDP watch and the step's report of its
    gradients, and leaves the module hooks as they were. Without a GPU: the engine's
    pressure is stood in for."""
    _, venv = um
    got = probe(venv, HOOK_SETTINGS_PROBE)
    on, off = got["predict"], got["predict_off"]
    assert on[0] and off[0]
    # With predict: the streamer's, the use signal's and the offload's module hooks and the
    # optimizer stager's; without: the use signal's pre- and post-forward hooks alone.
    assert off[1] == 2 and on[1] > off[1]
    assert got["same_after_budget"] is True
    assert got["ddp"] == [True, True]
    assert got["ddp_off"] == [False, False, True]  # the same module hooks, DDP's off
    assert got["ddp_on"] == [True, True, True]
    assert got["predict_on"] == on
    assert got["hooks_off"] == [False, 0]
    assert got["hooks_on"] == [False, 0]
    assert got["init"] is False


DDP_BUCKETS_PROBE = r"""
import json, tempfile, warnings, torch
import torch.distributed as dist
from torch.cuda import _um_ddp

dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
log = []
def forget(ptr, size):
    log.append(["forget", ptr, size])
    return size
def touch(ranges):
    log.append(["touch", sorted([r[0], r[1]] for r in ranges)])

def nets(find_unused=False):
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    ref = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    ref.load_state_dict(net.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(
        net, gradient_as_bucket_view=True, bucket_cap_mb=0.3, find_unused_parameters=find_unused)
    return ddp, ref

def storages(params):  # the gradients' storages, by (data_ptr, bytes): the same objects
    out = {}
    for p in params:
        st = p.grad.untyped_storage()
        out[(st.data_ptr(), st.nbytes())] = st
    return out

def same(ddp, ref):  # one rank: DDP's step is the plain model's, bit for bit
    return all(torch.equal(a, b) for a, b in zip(ddp.module.parameters(), ref.parameters()))

x = torch.randn(16, 256)
out = {"iters": []}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ddp, ref = nets()
    params = list(ddp.parameters())
    b = _um_ddp.Buckets(forget, touch)
    opt = torch.optim.SGD(params, lr=0.01)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.01)
    last = {}
    kept = None
    for it in range(7):
        log.clear()
        b.enter(ddp)
        released = sorted([k[0], k[1]] for k, st in last.items() if st.nbytes() == 0)
        forgets = sorted([e[1], e[2]] for e in log if e[0] == "forget")
        log.clear()
        if kept is not None:  # read during the forward, as a hook might: never a crash
            out.setdefault("kept_read", []).append(bool(torch.isfinite(kept).all()))
        ddp(x).pow(2).mean().backward()
        ref(x).pow(2).mean().backward()
        now = storages(params)
        out["iters"].append({
            "released": released, "forgets": forgets,
            "touched": [r for e in log if e[0] == "touch" for r in e[1]],
            # after the backward: every released bucket the reducer still uses is whole
            "back_whole": all(st.nbytes() == k[1] for k, st in last.items()
                              if st.nbytes() and [k[0], k[1]] in released),
            "storages": sorted([k[0], k[1]] for k in now),
            "counters": b.counters()})
        b.stepped([p for p in params if p.grad is not None])
        last = now
        # A program keeps a gradient (it 4) or a view of one (it 5) past zero_grad(): that
        # bucket is not released, and the program can read it during the next forward.
        kept = params[0].grad if it == 4 else params[-1].grad.view(-1) if it == 5 else None
        if kept is not None:
            out.setdefault("kept", []).append(
                [kept.untyped_storage().data_ptr(), kept.untyped_storage().nbytes()])
        opt.step(); opt_ref.step()
        out["iters"][-1]["same"] = same(ddp, ref)
        opt.zero_grad(set_to_none=(it != 2)); opt_ref.zero_grad()  # it 2 keeps zeroed grads

    # The hooks come off between a forward's releasing and its backward.
    ddp2, ref2 = nets()
    p2 = list(ddp2.parameters())
    b2 = _um_ddp.Buckets(forget, touch)
    opt2 = torch.optim.SGD(p2, lr=0.01)
    opt2_ref = torch.optim.SGD(ref2.parameters(), lr=0.01)
    for it in range(3):
        b2.enter(ddp2)
        ddp2(x).pow(2).mean().backward()
        ref2(x).pow(2).mean().backward()
        last2 = storages(p2)
        b2.stepped(p2)
        opt2.step(); opt2.zero_grad(); opt2_ref.step(); opt2_ref.zero_grad()
    log.clear()
    b2.enter(ddp2)
    gone = sorted([k[0], k[1]] for k, st in last2.items() if st.nbytes() == 0)
    b2.drop()
    whole = all(st.nbytes() == k[1] for k, st in last2.items())
    log.clear()
    ddp2(x).pow(2).mean().backward()
    ref2(x).pow(2).mean().backward()
    opt2.step(); opt2_ref.step()
    out["drop"] = {"released": gone, "whole_after_drop": whole, "log": log[:],
                   "same": same(ddp2, ref2), "buckets": len(last2)}

    # find_unused_parameters or a static graph: the reducer writes views no gradient hook
    # precedes (an unused parameter's, zeroed).
    out["unused"] = []
    for kind in ("find_unused", "static_graph"):
        ddp3, _ = nets(find_unused=kind == "find_unused")
        if kind == "static_graph":
            ddp3._set_static_graph()
        p3 = list(ddp3.parameters())
        b3 = _um_ddp.Buckets(forget, touch)
        log.clear()
        for it in range(3):
            b3.enter(ddp3)
            ddp3(x).pow(2).sum().backward()
            b3.stepped(p3)
            for p in p3:
                p.grad = None
        out["unused"].append({"log": log[:], "counters": b3.counters()})
out["warnings"] = [str(w.message) for w in caught if "um" in str(w.message).lower()]
dist.destroy_process_group()
print(json.dumps(out))
"""


def test_ddp_buckets_are_released_between_steps_and_back_before_written(
    um: tuple[UmPath, Path],
) -> None:
    """Note [DDP's buckets between steps] and [Who else holds a bucket], with a real
    DistributedDataParallel (gloo, one rank, on the CPU) against the same model without
    DDP, bit for bit at every step: a forward releases exactly the buckets its last step
    read and ``zero_grad()`` then dropped; the backward gives each back its memory before
    the reducer writes it; the buckets the reducer rebuilt away from are let go; zeroed
    gradients kept (``set_to_none=False``) are live and nothing is released; a gradient or
    a view of one that a program keeps past ``zero_grad()`` makes its bucket forgotten, not
    released, and stays readable during the next forward; when the hooks come off between the releasing and the backward, every
    released bucket is whole again at once; ``find_unused_parameters=True`` and a static
    graph release nothing."""
    _, venv = um
    got = probe(venv, DDP_BUCKETS_PROBE)
    iters = got["iters"]
    assert all(i["same"] for i in iters)
    assert iters[0]["released"] == [] and iters[0]["counters"]["predict.ddp_forgotten"] == 0
    # it 1: the first step's one bucket is released, then the reducer rebuilds (two buckets)
    # and the old one is let go, never given memory again.
    assert iters[1]["released"] == iters[0]["storages"] and len(iters[0]["storages"]) == 1
    assert len(iters[1]["storages"]) >= 2, "one bucket: the test would not tell them apart"
    assert iters[1]["counters"]["predict.ddp_let_go"] == 1
    assert iters[2]["released"] == iters[1]["storages"] and iters[2]["back_whole"]
    assert iters[3]["released"] == [] and iters[3]["forgets"] == []  # zeroed, kept: live
    assert iters[4]["released"] == iters[3]["storages"] and iters[4]["back_whole"]
    for i in iters[:5]:
        assert i["forgets"] == [] and i["touched"] == []
    assert iters[5]["back_whole"] and iters[6]["back_whole"]
    # its 5 and 6: the kept gradient's or view's bucket is forgotten and touched back, the
    # other released; the program read what it kept during the forward.
    kept = got["kept"]
    assert len(kept) == 2 and kept[0] != kept[1] and got["kept_read"] == [True, True]
    for it, bucket in zip((5, 6), kept, strict=True):
        assert iters[it]["forgets"] == [bucket] and iters[it]["touched"] == [bucket], it
        assert len(iters[it]["released"]) == len(iters[it - 1]["storages"]) - 1, it
        assert bucket not in iters[it]["released"], it
    c = iters[-1]["counters"]
    n = sum(len(i["released"]) + len(i["forgets"]) for i in iters)
    assert c["predict.ddp_forgotten"] == n
    assert c["predict.ddp_released"] == n - 2
    assert c["predict.ddp_touched"] + c["predict.ddp_let_go"] == n
    assert c["predict.ddp_forgotten_bytes"] == sum(
        s for i in iters for _, s in i["released"] + i["forgets"]
    )
    drop = got["drop"]
    assert len(drop["released"]) == drop["buckets"] >= 2
    assert drop["whole_after_drop"] and drop["log"] == [] and drop["same"]
    assert len(got["unused"]) == 2
    for unused in got["unused"]:
        assert unused["log"] == []
        assert unused["counters"]["predict.ddp_forgotten"] == 0
    assert got["warnings"] == []


MID_FORWARD_PROBE = r"""
import json, torch
from torch.cuda import _um_plan
from torch.nn.modules import module as nn_module

class Recorder(_um_plan.OutermostForward):
    def __init__(self):
        super().__init__()
        self.begun = []
    def _begin(self, module, args):
        self.begun.append(type(module).__name__)
        return [module]
    def _inner(self, run, module): pass
    def _leave(self, run, module): pass
    def _end(self, run): pass
    def _abandon(self, run): pass

h = Recorder()
handles = []

class Installer(torch.nn.Module):  # the pressure watcher, putting the hooks on mid-forward
    def forward(self, x):
        if not handles:
            handles.append(nn_module.register_module_forward_pre_hook(h.enter))
            handles.append(nn_module.register_module_forward_hook(h.exit, always_call=True))
        return x

model = torch.nn.Sequential(
    torch.nn.Linear(4, 4), Installer(), torch.nn.Linear(4, 4),
    torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 4)),
)
x = torch.randn(2, 4)
out = {}
for code in (None, nn_module.Module._call_impl.__code__):  # before um.py sets it, and after
    _um_plan.OutermostForward.call_code = code
    h.begun, handles[:] = [], []
    with torch.no_grad():
        model(x)
        first = list(h.begun)
        model(x)
    for handle in handles:
        handle.remove()
    out[str(code is not None)] = {"first": first, "second": h.begun[len(first):]}
print(json.dumps(out))
"""


def test_hooks_installed_mid_forward_take_no_layer_for_an_outermost_forward(
    um: tuple[UmPath, Path],
) -> None:
    """Note [Hooks that come on during a forward] (_um_plan.py), with torch's own module
    calls: hooks put on inside a forward took each later module of it for an outermost
    forward; knowing the frame of Module._call_impl, they take none, and the next forward's
    root is the outermost one, as before."""
    _, venv = um
    got = probe(venv, MID_FORWARD_PROBE)
    assert got["False"] == {"first": ["Linear", "Sequential"], "second": ["Sequential"]}
    assert got["True"] == {"first": [], "second": ["Sequential"]}
