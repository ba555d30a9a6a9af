"""Peak host memory (issue 9: remove redundant host copies): stock torch, the +um torch
before issue 9, the +um torch with managed host allocations, and its explicit move API.

    python -m bench.host_memory --stock-pythonpath STOCK --um-pythonpath UM
        [--scenarios listing1,checkpoint,dataloader] [--modes stock,um-before,um,um-move]
        [--listing-gib 16] [--listing-budget-gib 8] [--batch-mib 64] [--batches 40]
        [--rounds 1] [--workdir DIR] [--out DIR]

Modes (each scenario and mode is a worker process of its own, so that a process-lifetime
peak belongs to one measurement):
  stock      an unmodified torch, plain cudaMalloc, no device budget (memory is not capped)
  um-before  the +um torch with PYTORCH_CUDA_UM_CONF=host_alloc:default: CPU tensors are
             ordinary malloc memory and loading is not zero-copy (the behaviour before issue 9)
  um         the +um torch with host_alloc:managed: CPU tensors of 1 MiB or more are managed
             memory placed in host RAM once the process has made a managed segment; the
             scenario's code is unchanged (it still copies)
  um-move    the explicit route: the data to move is allocated inside
             torch.cuda.um.managed_host() and moved with torch.cuda.um.move_(obj, "cuda")
             (in place, no copy for managed storage) instead of being copied
Every +um worker initialises CUDA, reads free device memory and sets the engine's
total-managed cap to 80 % of it (bench/common.py: safe_cap) with the scenario's device
budget, before its first CUDA allocation; a case whose managed memory would not fit under the
cap, or whose host memory (MemAvailable) or, for stock, device memory is short, is recorded
as skipped with the reason.

Scenarios (``checkpoint`` names the three checkpoint ones):
  listing1             Listing 1 of Choi et al.: x = LISTING_GIB of float32 on the CPU,
                       y = x.to("cuda"), y.pow_(2), x.pow_(2), torch.equal(x, y.to("cpu")),
                       device budget LISTING_BUDGET_GIB. x is generated in chunks of 256 MiB,
                       each from its own seed. um-move: y = um.move_(x, "cuda"), y.pow_(2), and
                       y is compared chunk by chunk with a reference regenerated from the seeds
                       (after the peak is read). Seconds: the whole listing.
  checkpoint-fits      a bf16 GPT-2-style checkpoint (GPT2LMHeadModel, 24 layers, d 2048, 16
                       heads, vocab 50257, 1024 positions: 1.31 B parameters, about 2.5 GiB)
                       loaded into a model whose parameters are on the GPU (built on the meta
                       device, then to_empty(device="cuda")): torch.load(map_location="cpu"),
                       model.load_state_dict(sd). um-move: torch.load(map_location="cpu"),
                       um.move_(list(sd.values()), "cuda"), load_state_dict(sd, assign=True)
                       into the meta model. No device budget (the engine's default).
  checkpoint-2x        the same with a device budget of half the checkpoint (stock has no
                       budget: it runs in memory, and its record says so)
  checkpoint-map-cuda  sd = torch.load(map_location="cuda"), load_state_dict(sd, assign=True)
                       into the meta model (modes stock, um-before, um)
  dataloader           DataLoader(batch_size=None, num_workers=2, pin_memory=True) over
                       BATCHES synthetic float32 batches of BATCH_MIB each; per batch
                       b.to("cuda", non_blocking=True) and a float64 sum, synchronised at the
                       end; the total must equal the sum known on the CPU (modes stock,
                       um-before, um). Also records the peak RSS of the loader's worker
                       processes (RUSAGE_CHILDREN: they inherit the parent's pages at fork).
Checkpoint seconds: torch.load through load_state_dict, with torch.cuda.synchronize(). After
loading, the first, middle and last parameter must match the checkpoint: their bit patterns'
int64 sum and first and last 64 elements, written beside the checkpoint when it is saved. The
checkpoint is written once per run by a ``prepare`` worker (the stock torch) into --workdir
(default: a temporary folder, removed at the end; a given --workdir is kept, and a checkpoint
there from an earlier run is reused).

Measured per worker: ``base_rss`` (VmRSS of /proc/self/status just before the measured part),
``peak_rss`` (ru_maxrss of getrusage(RUSAGE_SELF) at its end: the process-lifetime peak, so
every case is a fresh process), ``delta = peak - base``, and the cgroup v2 ``memory.peak`` of
the worker's cgroup (/proc/self/cgroup, then /sys/fs/cgroup/<path>/memory.peak; null where
absent or unreadable; reset at the start where the kernel allows a write to it, else the
cgroup's lifetime peak: ``cgroup_peak_scope`` says which; it counts every process of the
cgroup, the orchestrator and the page cache included). Managed pages resident in host RAM
are expected in the process's RSS (``rss_at_end_bytes`` splits it into anon, file and shmem);
whether the cgroup is charged for them is for the records to show.

The record, ``<out>/host_memory[-<scenarios>]-<gpu>-<date>.json``: command, machine, the +um
torch and engine, settings, ``summary`` = ``{<scenario>: {<mode>: {"peak_rss_gib",
"base_rss_gib", "delta_gib", "seconds", "cgroup_peak_gib", ..., "peak_over_stock",
"delta_over_stock", "seconds_over_stock"}}}`` (median over rounds; ``{"skipped": reason}`` or
``{"error": ...}`` where a case did not run), and every sample. The exit status is 1 when a
worker failed (a check included), after the record is written.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import math
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    BenchError,
    GiB,
    cell,
    command_line,
    emit,
    error_text,
    last_line,
    machine,
    run_main,
    run_worker_safely,
    safe_cap,
    um_module,
    write,
)

MODULE = "bench.host_memory"
NAME = "host_memory"
MiB = 1 << 20
MODES = ("stock", "um-before", "um", "um-move", "um-pin")
PREPARE = "prepare"  # the worker that writes the checkpoint
# PYTORCH_CUDA_UM_CONF of each +um mode, set before torch is imported.
UM_CONF = {
    "um-before": "host_alloc:default",
    "um": "host_alloc:managed",
    # The explicit route: data allocated inside um.managed_host(), then um.move_.
    "um-move": "host_alloc:default",
    # DataLoader batches page-locked where the workers left them (Note [Pinned in place]).
    "um-pin": "host_alloc:default,pin_in_place:True",
}
CHECKPOINTS = ("checkpoint-fits", "checkpoint-2x", "checkpoint-map-cuda")
# Scenario: the modes it applies to (um-move has nothing to move in the others).
SCENARIOS: dict[str, tuple[str, ...]] = {
    "listing1": MODES[:4],
    "checkpoint-fits": MODES[:4],
    "checkpoint-2x": MODES[:4],
    "checkpoint-map-cuda": ("stock", "um-before", "um"),
    "dataloader": ("stock", "um-before", "um", "um-pin"),
}
GROUPS = {"checkpoint": CHECKPOINTS}  # names that stand for several scenarios
DEFAULT_SCENARIOS = ("listing1", "checkpoint", "dataloader")
SEED = 1234
CHUNK = 64 << 20  # float32 elements per generated chunk of listing 1's tensor (256 MiB)
# The checkpoint's model: transformers.GPT2Config(**GPT2).
GPT2 = {"n_layer": 24, "n_embd": 2048, "n_head": 16, "vocab_size": 50257, "n_positions": 1024}
CHECKPOINT = "gpt2-1.3b-bf16.pt"
PROBE = 64  # elements compared at each end of a checked parameter
PERIOD = 251  # dataloader batches: value k = k % PERIOD + index % 7, exact in float32
LOADER_WORKERS = 2
# Host memory (MemAvailable) a case needs, in units of its size (tensor, checkpoint, batch).
HOST_FACTOR = {"listing1": 3.2, "checkpoint": 3.0, "dataloader": 16.0}
CGROUP_ROOT = Path("/sys/fs/cgroup")
NOTE_2X_STOCK = "stock has no device budget: in memory"


# ---------------------------------------------------------------- pure parts (unit tested)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every worker of a run measures with (bytes)."""

    listing_bytes: int
    listing_budget: int
    batch_bytes: int
    batches: int


def _positive(value: float, what: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise BenchError(f"{what} must be a positive number, got {value}")
    return value


def parse_settings(
    listing_gib: float, listing_budget_gib: float, batch_mib: float, batches: int
) -> Settings:
    """Settings from the command line's units, sizes rounded down to 4 KiB; BenchError on
    a size that is not positive or a batch too large for the synthetic dataset."""
    listing = int(_positive(listing_gib, "--listing-gib") * GiB) // 4096 * 4096
    budget = int(_positive(listing_budget_gib, "--listing-budget-gib") * GiB) // 4096 * 4096
    batch = int(_positive(batch_mib, "--batch-mib") * MiB) // 4096 * 4096
    if not listing or not budget or not batch:
        raise BenchError(
            "--listing-gib, --listing-budget-gib and --batch-mib must be 4 KiB or more"
        )
    if batch > 4096 * MiB:
        raise BenchError(f"--batch-mib {batch_mib}: at most 4096 (int32 indices of float32)")
    if batches < 1:
        raise BenchError(f"--batches must be at least 1, got {batches}")
    return Settings(listing, budget, batch, batches)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def selected_scenarios(text: str | None) -> list[str]:
    """Scenario names from ``--scenarios`` (``checkpoint`` stands for its three), in the
    order given, each once."""
    out: list[str] = []
    for name in _names(text if text is not None else ",".join(DEFAULT_SCENARIOS)):
        if name not in SCENARIOS and name not in GROUPS:
            choices = ", ".join([*DEFAULT_SCENARIOS, *CHECKPOINTS])
            raise BenchError(f"--scenarios {text!r}: unknown {name!r} (choose from {choices})")
        out += [s for s in GROUPS.get(name, (name,)) if s not in out]
    if not out:
        raise BenchError(f"--scenarios {text!r}: name at least one scenario")
    return out


def selected_modes(text: str | None) -> list[str]:
    """Mode names from ``--modes`` (default all four)."""
    if text is None:
        return list(MODES)
    modes = _names(text)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise BenchError(f"--modes {text!r}: modes are {', '.join(MODES)}")
    return list(dict.fromkeys(modes))


def cases(scenarios: list[str], modes: list[str]) -> list[tuple[str, str]]:
    """(scenario, mode) for every selected mode that applies to a selected scenario."""
    out = [(s, m) for s in scenarios for m in modes if m in SCENARIOS[s]]
    if not out:
        raise BenchError(
            f"no case to run: modes {', '.join(modes)} do not apply to {', '.join(scenarios)}"
        )
    return out


def record_name(scenarios: list[str]) -> str:
    """``host_memory`` for the default scenarios, else ``host_memory-<names>``, so that
    runs of single scenarios on one day do not overwrite each other's file."""
    if scenarios == selected_scenarios(None):
        return NAME
    names = list(scenarios)
    if all(s in names for s in CHECKPOINTS):
        at = names.index(CHECKPOINTS[0])
        names = [n for n in names if n not in CHECKPOINTS]
        names.insert(at, "checkpoint")
    return f"{NAME}-{'-'.join(names)}"


def chunk_plan(numel: int, chunk: int, seed: int) -> list[tuple[int, int, int]]:
    """(start, stop, seed) of each chunk of a tensor generated chunk by chunk, so that any
    chunk can be regenerated alone."""
    return [(a, min(a + chunk, numel), seed + i) for i, a in enumerate(range(0, numel, chunk))]


def fill_chunks(torch: Any, x: Any, plan: list[tuple[int, int, int]]) -> None:
    """Fill the 1-D float32 tensor ``x`` in place, each chunk uniform [0, 1) from its seed."""
    gen = torch.Generator()
    for start, stop, seed in plan:
        gen.manual_seed(seed)
        x[start:stop].uniform_(0.0, 1.0, generator=gen)


def reference_chunk(torch: Any, start: int, stop: int, seed: int) -> Any:
    """The values ``fill_chunks`` put in ``x[start:stop]`` for that chunk, regenerated."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    return torch.empty(stop - start, dtype=torch.float32).uniform_(0.0, 1.0, generator=gen)


def batch_sum(index: int, numel: int) -> int:
    """The sum of dataloader batch ``index`` (values k % PERIOD + index % 7, k < numel)."""
    full, rest = divmod(numel, PERIOD)
    return full * PERIOD * (PERIOD - 1) // 2 + rest * (rest - 1) // 2 + numel * (index % 7)


def gpt2_params(cfg: dict[str, int]) -> int:
    """Parameters of GPT2LMHeadModel(GPT2Config(**cfg)), the head tied to the embedding."""
    d, vocab, pos, layers = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
    block = (
        2 * 2 * d  # ln_1, ln_2
        + d * 3 * d
        + 3 * d  # attn.c_attn
        + d * d
        + d  # attn.c_proj
        + d * 4 * d
        + 4 * d  # mlp.c_fc
        + 4 * d * d
        + d  # mlp.c_proj
    )
    return vocab * d + pos * d + layers * block + 2 * d  # wte, wpe, blocks, ln_f


def probe_names(names: list[str]) -> list[str]:
    """The parameters a load is checked on: the first, the middle and the last."""
    if not names:
        return []
    return list(dict.fromkeys([names[0], names[len(names) // 2], names[-1]]))


def status_bytes(text: str, key: str) -> int | None:
    """``key`` of /proc/self/status or /proc/meminfo text (``VmRSS:  123 kB``) in bytes."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            parts = value.split()
            if parts and parts[0].isdigit():
                unit = parts[1].lower() if len(parts) > 1 else ""
                return int(parts[0]) * (1024 if unit == "kb" else 1)
    return None


def rss_bytes() -> int:
    """This process's resident memory now (VmRSS of /proc/self/status; managed host pages
    count there), in bytes; 0 where the kernel gives none."""
    return status_bytes(_read("/proc/self/status"), "VmRSS") or 0


def cgroup_peak_path(cgroup_text: str, root: Path) -> Path | None:
    """memory.peak of the cgroup v2 a process is in, from its /proc/<pid>/cgroup text
    (the ``0::<path>`` line) under the cgroup2 mount ``root``; None without that line."""
    for line in cgroup_text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "" and path.startswith("/"):
            return root.joinpath(*[p for p in path.split("/") if p], "memory.peak")
    return None


def managed_need(scenario: str, mode: str, size: int) -> int:
    """Managed bytes a case may hold at once (size: tensor, checkpoint or batch bytes)."""
    if mode == "stock":
        return 0
    if scenario == "listing1":
        # um: x, y and y.to("cpu") are all managed; um-move: x, and two chunks to check it.
        return {"um-before": size, "um": 3 * size}.get(mode, size + 8 * CHUNK)
    if scenario == "dataloader":
        return 4 * size
    return 2 * size  # checkpoints: the parameters and at most one loaded copy


def host_need(scenario: str, size: int) -> int:
    """MemAvailable a case needs."""
    kind = "checkpoint" if scenario in CHECKPOINTS else scenario
    return int(HOST_FACTOR[kind] * size)


def skip_reason(
    scenario: str, mode: str, size: int, available: int | None, free: int, cap: int
) -> str | None:
    """Why a case cannot run safely here, or None."""
    need = host_need(scenario, size)
    if available is not None and available < need:
        return (
            f"host RAM: MemAvailable {available / GiB:.1f} GiB, the case needs {need / GiB:.1f} GiB"
        )
    if mode == "stock":
        dev = 2 * size if scenario == "dataloader" else size
        if free < dev:
            return f"GPU: {free / GiB:.1f} GiB free, stock needs {dev / GiB:.1f} GiB on the device"
        return None
    managed = managed_need(scenario, mode, size)
    if managed > cap:
        return (
            f"managed cap: {managed / GiB:.1f} GiB of managed memory needed, the cap (80 % of "
            f"free GPU memory) is {cap / GiB:.1f} GiB"
        )
    return None


def _ok(sample: dict[str, Any]) -> bool:
    return "error" not in sample and "skipped" not in sample


def _gib(value: float | None) -> float | None:
    return None if value is None else round(value / GiB, 4)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known and len(known) == len(values) else None


def _row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode's summary over its successful workers (medians)."""

    def med(key: str) -> float | None:
        return _median([r.get(key) for r in runs])

    deltas = [r["peak_rss_bytes"] - r["base_rss_bytes"] for r in runs]
    row: dict[str, Any] = {
        "peak_rss_gib": _gib(med("peak_rss_bytes")),
        "base_rss_gib": _gib(med("base_rss_bytes")),
        "delta_gib": _gib(statistics.median(deltas)),
        "seconds": med("seconds"),
        "cgroup_peak_gib": _gib(med("cgroup_peak_bytes")),
    }
    if "checkpoint_bytes" in runs[0]:
        ckpt = runs[0]["checkpoint_bytes"]
        row["checkpoint_gib"] = _gib(ckpt)
        row["delta_over_checkpoint"] = round(statistics.median(deltas) / ckpt, 4)
    if "tensor_bytes" in runs[0]:
        row["tensor_gib"] = _gib(runs[0]["tensor_bytes"])
    if "batch_bytes" in runs[0]:
        row["batch_gib"] = _gib(runs[0]["batch_bytes"])
        row["children_peak_rss_gib"] = _gib(med("children_peak_rss_bytes"))
    if "ok" in runs[0]:
        row["ok"] = all(r.get("ok") for r in runs)
    notes = sorted({r["note"] for r in runs if r.get("note")})
    if notes:
        row["note"] = "; ".join(notes)
    return row


def summarize(
    samples: list[dict[str, Any]], plan: list[tuple[str, str]]
) -> dict[str, dict[str, dict[str, Any]]]:
    """{scenario: {mode: row}} for every planned case: medians over the case's successful
    workers, and each row's ratios to the scenario's stock row; ``{"skipped": reason}`` or
    ``{"error": last line}`` where none succeeded."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for scenario, mode in plan:
        runs = [s for s in samples if s.get("scenario") == scenario and s.get("mode") == mode]
        good = [s for s in runs if _ok(s)]
        if good:
            row = _row(good)
        elif any("skipped" in s for s in runs):
            row = {"skipped": next(s["skipped"] for s in runs if "skipped" in s)}
        elif runs:
            row = {"error": last_line(next(s["error"] for s in runs if "error" in s))}
        else:
            row = {"error": "not run"}
        row["runs"] = len(runs)
        errors = sum(1 for s in runs if "error" in s)
        if errors and good:
            row["errors"] = errors
        out.setdefault(scenario, {})[mode] = row
    for rows in out.values():
        stock = rows.get("stock", {})
        for row in rows.values():
            for key, ratio in (
                ("peak_rss_gib", "peak_over_stock"),
                ("delta_gib", "delta_over_stock"),
                ("seconds", "seconds_over_stock"),
            ):
                if key in row:
                    mine, base = row[key], stock.get(key)
                    row[ratio] = round(mine / base, 4) if mine is not None and base else None
    return out


def table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The printed table: per scenario and mode, seconds, peak and delta RSS, ratios."""
    lines = [
        f"{'scenario':21s}{'mode':11s}{'seconds':>9s}{'peak GiB':>10s}{'delta GiB':>11s}"
        f"{'peak/stock':>12s}{'delta/stock':>13s}{'s/stock':>9s}  note"
    ]
    for scenario, rows in summary.items():
        for mode, row in rows.items():
            head = f"{scenario:21s}{mode:11s}"
            if "peak_rss_gib" not in row:
                why = row.get("skipped") or row.get("error", "")
                what = "skipped" if "skipped" in row else "ERROR"
                lines.append(f"{head}{'':>64s}  {what}: {why}")
                continue
            note = [row["note"]] if row.get("note") else []
            if row.get("errors"):
                note.append(f"{row['errors']} of {row['runs']} failed")
            if "delta_over_checkpoint" in row:
                note.append(f"delta/checkpoint {row['delta_over_checkpoint']:.2f}")
            if row.get("children_peak_rss_gib") is not None:
                note.append(f"loader workers' peak {row['children_peak_rss_gib']:.2f} GiB")
            lines.append(
                f"{head}{cell(row['seconds'], '9.3f')}{cell(row['peak_rss_gib'], '10.2f')}"
                f"{cell(row['delta_gib'], '11.2f')}{cell(row.get('peak_over_stock'), '12.3f')}"
                f"{cell(row.get('delta_over_stock'), '13.3f')}"
                f"{cell(row.get('seconds_over_stock'), '9.3f')}  {'; '.join(note)}"
            )
    return "\n".join(lines)


def describe(s: dict[str, Any]) -> str:
    """One line per finished worker."""
    head = f"{s.get('scenario', '?'):21s}{s.get('mode', '?'):11s}"
    if "skipped" in s:
        return head + " skipped: " + str(s["skipped"])
    if "error" in s:
        return head + " ERROR " + last_line(s["error"])
    delta = (s["peak_rss_bytes"] - s["base_rss_bytes"]) / GiB
    return (
        head + f" {s['seconds']:.3f} s, peak RSS {s['peak_rss_bytes'] / GiB:.2f} GiB, "
        f"delta {delta:.2f} GiB"
    )


def reusable_checkpoint(path: Path) -> dict[str, Any] | None:
    """The facts of a checkpoint written earlier (its JSON beside it), if they fit this
    benchmark's model and the file; else None."""
    facts_path = path.with_suffix(".json")
    try:
        facts: dict[str, Any] = json.loads(facts_path.read_text())
        size = path.stat().st_size
    except (OSError, ValueError):
        return None
    if facts.get("config") != GPT2 or facts.get("bytes") != size or not facts.get("checks"):
        return None
    return facts


def record(
    samples: list[dict[str, Any]], settings: dict[str, Any], summary: dict[str, Any]
) -> dict[str, Any]:
    """What bench.common.write stores: like bench.common.save, but tolerant of modes that
    were not selected, were skipped or failed (a failed sample carries no machine)."""
    with_machine = [s for s in samples if "machine" in s]
    if not with_machine:
        raise BenchError("no worker got as far as CUDA:\n" + describe(samples[-1]))
    stock = [s for s in with_machine if s["mode"] == "stock"]
    um = [s for s in with_machine if s["mode"] != "stock"]
    return {
        "command": command_line(MODULE),
        "machine": (stock or with_machine)[0]["machine"],
        "um_torch": um[0]["machine"]["torch"] if um else None,
        "um_engine": um[0]["machine"]["um_engine"] if um else None,
        "settings": settings,
        "summary": summary,
        "samples": [{k: v for k, v in s.items() if k != "machine"} for s in samples],
    }


# ---------------------------------------------------------------- workers (need a GPU)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def open_cgroup_peak(path: Path | None) -> tuple[int | None, bool]:
    """(descriptor of memory.peak or None, whether its peak was reset to now): a write to
    memory.peak resets the peak seen through that descriptor (Linux 6.12 and later)."""
    if path is None:
        return None, False
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        try:
            return os.open(path, os.O_RDONLY), False
        except OSError:
            return None, False
    try:
        os.write(fd, b"reset\n")
        return fd, True
    except OSError:
        return fd, False


def read_cgroup_peak(fd: int | None) -> int | None:
    """The bytes memory.peak reads through ``fd`` now, or None."""
    if fd is None:
        return None
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return int(os.read(fd, 64).decode().strip())
    except (OSError, ValueError):
        return None


class Meter:
    """Host memory of this process from just before a measured part to its end."""

    def __init__(self) -> None:
        path = cgroup_peak_path(_read("/proc/self/cgroup"), CGROUP_ROOT)
        self.cgroup_path = str(path) if path else None
        self.fd, self.reset = open_cgroup_peak(path)
        self.peak_before = _maxrss()
        self.base = rss_bytes()

    def stop(self) -> dict[str, Any]:
        """The measured part's fields; call once, right after it."""
        peak = _maxrss()
        cgroup = read_cgroup_peak(self.fd)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        status = _read("/proc/self/status")
        return {
            "base_rss_bytes": self.base,
            "peak_rss_bytes": peak,
            "peak_rss_before_bytes": self.peak_before,
            "rss_at_end_bytes": {
                k: status_bytes(status, k) for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")
            },
            "cgroup_peak_bytes": cgroup,
            "cgroup_peak_scope": None
            if cgroup is None
            else "since base (reset)"
            if self.reset
            else "cgroup lifetime",
            "cgroup_path": self.cgroup_path,
        }


def _setup(torch: Any, mode: str, budget: int | None) -> tuple[Any, dict[str, Any]]:
    """Check the torch against the mode, initialise CUDA, cap managed memory at 80 % of
    what is free (the scenario's budget with it) before any CUDA allocation."""
    um = um_module(torch, mode)
    if mode == "um-move" and not hasattr(um, "move_"):
        raise BenchError(f"mode um-move needs torch.cuda.um.move_, which {torch.__file__} lacks")
    torch.cuda.init()
    free, total, cap = safe_cap(torch)
    info: dict[str, Any] = {"free_at_start": free, "total": total, "cap": None, "budget": budget}
    if um is not None:
        um.configure(enabled=True, max_managed=cap, device_budget=budget)
        conf = um.get_config()
        for item in UM_CONF[mode].split(","):
            key, _, want = item.partition(":")
            if conf.get(key) != want:
                raise BenchError(
                    f"mode {mode}: the engine reports {key} {conf.get(key)!r}, not {want!r} "
                    "(a +um torch with issue 9's settings is needed)"
                )
        info.update(cap=cap, um_config=conf)
    return um, info


def _host_scope(um: Any, mode: str) -> Any:
    """um-move allocates the data it will move inside um.managed_host() (managed host
    memory); the other modes allocate as the engine's host_alloc setting says."""
    return um.managed_host() if mode == "um-move" else contextlib.nullcontext()


def _listing1(torch: Any, um: Any, mode: str, s: Settings) -> dict[str, Any]:
    """Listing 1 (um-move: with um.move_); the check of um-move comes after the peak."""
    numel = s.listing_bytes // 4
    plan = chunk_plan(numel, CHUNK, SEED)
    meter = Meter()
    t0 = time.perf_counter()
    with _host_scope(um, mode):
        x = torch.empty(numel, dtype=torch.float32)
    fill_chunks(torch, x, plan)
    t1 = time.perf_counter()
    out: dict[str, Any] = {"tensor_bytes": numel * 4}
    if um is not None:
        out["x_managed"] = bool(um.is_managed(x))
    if mode == "um-move":
        ptr = x.data_ptr()
        y = um.move_(x, "cuda")
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if y.device.type != "cuda":
            raise BenchError(f"um.move_(x, 'cuda') returned a tensor on {y.device}")
        out["zero_copy"] = y.data_ptr() == ptr
        y.pow_(2)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        mem = meter.stop()
        ok = True
        for start, stop, seed in plan:  # bounded memory: one chunk at a time
            ref = reference_chunk(torch, start, stop, seed).pow_(2)
            if not torch.equal(y[start:stop].cpu(), ref):
                ok = False
                break
        phases = {"generate_s": t1 - t0, "move_s": t2 - t1, "pow_cuda_s": t3 - t2}
    else:
        y = x.to("cuda")
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        y.pow_(2)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        x.pow_(2)
        t4 = time.perf_counter()
        ok = bool(torch.equal(x, y.to("cpu")))
        t5 = time.perf_counter()
        mem = meter.stop()
        phases = {
            "generate_s": t1 - t0,
            "to_cuda_s": t2 - t1,
            "pow_cuda_s": t3 - t2,
            "pow_cpu_s": t4 - t3,
            "compare_s": t5 - t4,
        }
    if not ok:
        raise BenchError(f"listing1 {mode}: y differs from x squared on the CPU")
    seconds = sum(phases.values())
    return {**out, **mem, **phases, "seconds": seconds, "ok": ok}


def _meta_model(torch: Any, transformers: Any) -> Any:
    """GPT2LMHeadModel(GPT2Config(**GPT2)) in bf16 on the meta device (no memory)."""
    config = transformers.GPT2Config(**GPT2, use_cache=False)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config)
    return model.to(torch.bfloat16)


def fingerprint(torch: Any, t: Any) -> dict[str, Any]:
    """Exact facts of a bf16 tensor: its bit patterns' int64 sum and its first and last
    PROBE bit patterns (order-independent sums: equal on the CPU and the GPU)."""
    bits = t.detach().reshape(-1).view(torch.int16)
    return {
        "numel": int(bits.numel()),
        "bits_sum": int(bits.sum(dtype=torch.int64)),
        "head": [int(v) for v in bits[:PROBE].tolist()],
        "tail": [int(v) for v in bits[-PROBE:].tolist()],
    }


def prepare(torch: Any, path: Path) -> dict[str, Any]:
    """Write the checkpoint (seeded bf16 weights) and its facts (``.json`` beside it)."""
    transformers = importlib.import_module("transformers")
    model = _meta_model(torch, transformers).to_empty(device="cpu")
    model.tie_weights()
    names = []
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            gen = torch.Generator()
            gen.manual_seed(SEED + i)
            p.uniform_(-0.05, 0.05, generator=gen)
            names.append(name)
        for b in model.buffers():
            b.zero_()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    torch.save(model.state_dict(), partial)
    os.replace(partial, path)
    facts = {
        "config": GPT2,
        "bytes": path.stat().st_size,
        "params": int(sum(p.numel() for p in model.parameters())),
        "checks": {n: fingerprint(torch, model.get_parameter(n)) for n in probe_names(names)},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    partial = path.with_name(f"{path.name}.{os.getpid()}.json.partial")
    partial.write_text(json.dumps(facts) + "\n")
    os.replace(partial, path.with_suffix(".json"))
    return facts


def _checkpoint(torch: Any, um: Any, mode: str, scenario: str, path: Path) -> dict[str, Any]:
    """Load the checkpoint as the scenario and mode say; check three parameters after."""
    transformers = importlib.import_module("transformers")
    facts = json.loads(path.with_suffix(".json").read_text())
    assign = mode == "um-move" or scenario == "checkpoint-map-cuda"
    model = _meta_model(torch, transformers)
    if not assign:
        model = model.to_empty(device="cuda")
        model.tie_weights()
    torch.cuda.synchronize()
    meter = Meter()
    t0 = time.perf_counter()
    where = "cuda" if scenario == "checkpoint-map-cuda" else "cpu"
    with _host_scope(um, mode):
        sd = torch.load(path, map_location=where, weights_only=True)
    t1 = time.perf_counter()
    out: dict[str, Any] = {"checkpoint_bytes": facts["bytes"], "assign": assign}
    if mode == "um-move":
        tensors = list(sd.values())
        ptrs = [t.data_ptr() for t in tensors]
        um.move_(tensors, "cuda")
        if any(t.device.type != "cuda" for t in sd.values()):
            raise BenchError("um.move_(list of tensors, 'cuda') left a tensor off the GPU")
        out["tensors"] = len(tensors)
        out["zero_copy_tensors"] = sum(
            a == t.data_ptr() for a, t in zip(ptrs, tensors, strict=True)
        )
    model.load_state_dict(sd, assign=assign)
    model.tie_weights()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    mem = meter.stop()
    del sd
    params = dict(model.named_parameters())
    off = [n for n, p in params.items() if p.device.type != "cuda"]
    if off:
        raise BenchError(f"{scenario} {mode}: {len(off)} parameters not on the GPU ({off[0]})")
    for name, want in facts["checks"].items():
        got = fingerprint(torch, model.get_parameter(name))
        if got != want:
            raise BenchError(f"{scenario} {mode}: parameter {name} differs from the checkpoint")
    if um is not None:
        out["managed_params"] = sum(bool(um.is_managed(p)) for p in params.values())
        out["params"] = len(params)
        out["um_host_placed_bytes"] = um.stats().get("um.host_placed_bytes")
    if scenario == "checkpoint-2x" and mode == "stock":
        out["note"] = NOTE_2X_STOCK
    return {**out, **mem, "load_s": t1 - t0, "seconds": t2 - t0, "ok": True}


class SyntheticBatches:
    """Map-style dataset of float32 batches, value k of batch i = k % PERIOD + i % 7
    (module level, so that spawned loader workers can unpickle it)."""

    def __init__(self, numel: int, batches: int) -> None:
        self.numel = numel
        self.batches = batches

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self.batches:
            raise IndexError(index)
        torch = importlib.import_module("torch")
        values = torch.arange(self.numel, dtype=torch.int32).remainder_(PERIOD).add_(index % 7)
        return values.to(torch.float32)


def _dataloader(torch: Any, s: Settings) -> dict[str, Any]:
    """The loader loop; the sum of the batches' sums must be the known one."""
    data = importlib.import_module("torch.utils.data")
    numel = s.batch_bytes // 4
    meter = Meter()
    t0 = time.perf_counter()
    loader = data.DataLoader(
        SyntheticBatches(numel, s.batches),
        batch_size=None,
        num_workers=LOADER_WORKERS,
        pin_memory=True,
    )
    total = torch.zeros((), dtype=torch.float64, device="cuda")
    for batch in loader:  # exhausted: the loader joins its workers
        total += batch.to("cuda", non_blocking=True).sum(dtype=torch.float64)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    mem = meter.stop()
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    want = sum(batch_sum(i, numel) for i in range(s.batches))
    got = float(total)
    if got != want:
        raise BenchError(f"dataloader: the batches sum to {got} on the GPU, {want} on the CPU")
    return {
        **mem,
        "seconds": seconds,
        "batch_bytes": numel * 4,
        "batches": s.batches,
        "children_peak_rss_bytes": children,
        "start_method": torch.multiprocessing.get_start_method(),
        "ok": True,
    }


def _available() -> int | None:
    return status_bytes(_read("/proc/meminfo"), "MemAvailable")


def _measure(
    torch: Any, scenario: str, mode: str, s: Settings, checkpoint: Path | None
) -> dict[str, Any]:
    """Set up the mode, skip an unsafe case, run the scenario; machine() last (it starts
    subprocesses, which RUSAGE_CHILDREN would count)."""
    facts: dict[str, Any] = {}
    if scenario in CHECKPOINTS:
        if checkpoint is None:
            raise BenchError(f"{scenario} needs --checkpoint")
        facts = json.loads(checkpoint.with_suffix(".json").read_text())
    budget: int | None = None
    if scenario == "listing1":
        budget, size = s.listing_budget, s.listing_bytes
    elif scenario == "dataloader":
        size = s.batch_bytes
    else:
        size = facts["bytes"]
        if scenario == "checkpoint-2x":
            budget = size // 2 // 4096 * 4096
    um, info = _setup(torch, mode, budget if mode != "stock" else None)  # stock: no budget
    free, cap = info["free_at_start"], info["cap"] or 0
    reason = skip_reason(scenario, mode, size, _available(), free, cap)
    if reason is not None:
        return {**info, "skipped": reason, "machine": machine(torch)}
    if scenario == "listing1":
        fields = _listing1(torch, um, mode, s)
    elif scenario == "dataloader":
        fields = _dataloader(torch, s)
    else:
        assert checkpoint is not None
        fields = _checkpoint(torch, um, mode, scenario, checkpoint)
    if um is not None:
        fields["um_stats"] = um.stats()
    return {**info, **fields, "machine": machine(torch)}


def worker(scenario: str, mode: str, s: Settings, checkpoint: Path | None) -> None:
    """One case (or the checkpoint); always emits one record, an error included."""
    base: dict[str, Any] = {"scenario": scenario, "mode": mode}
    try:
        if mode in UM_CONF:  # before torch is imported
            os.environ["PYTORCH_CUDA_UM_CONF"] = UM_CONF[mode]
        torch = importlib.import_module("torch")
        if mode == PREPARE:
            if checkpoint is None:
                raise BenchError("prepare needs --checkpoint")
            emit({**base, **prepare(torch, checkpoint)})
        else:
            emit({**base, **_measure(torch, scenario, mode, s, checkpoint)})
    except Exception:  # the orchestrator reports every failure
        emit({**base, "error": error_text(), "peak_rss_bytes": _maxrss()})


# ---------------------------------------------------------------- orchestrator


def _case(
    scenario: str, mode: str, args: list[str], pythonpath: str | None, timeout: int
) -> dict[str, Any]:
    """One worker for one scenario and mode; a crash or a timeout is an error sample."""
    return run_worker_safely(
        MODULE,
        ["--mode", mode, "--scenario", scenario, *args],
        pythonpath,
        timeout,
        {"scenario": scenario, "mode": mode},
    )


def _checkpoint_file(workdir: Path, pythonpath: str | None, timeout: int) -> dict[str, Any]:
    """The checkpoint's facts: reused from --workdir, or written by a prepare worker."""
    path = workdir / CHECKPOINT
    facts = reusable_checkpoint(path)
    if facts is not None:
        print(f"reusing {path} ({facts['bytes'] / GiB:.2f} GiB)", flush=True)
        return facts
    free = shutil.disk_usage(workdir).free
    need = gpt2_params(GPT2) * 2 + GiB
    if free < need:
        raise BenchError(
            f"--workdir {workdir}: {free / GiB:.1f} GiB free, the checkpoint needs "
            f"{need / GiB:.1f} GiB"
        )
    print(f"writing the checkpoint {path} ...", flush=True)
    res = _case("checkpoint", PREPARE, ["--checkpoint", str(path)], pythonpath, timeout)
    if "error" in res:
        raise BenchError("writing the checkpoint failed:\n" + str(res["error"]))
    print(f"checkpoint: {res['params']} parameters, {res['bytes'] / GiB:.2f} GiB", flush=True)
    return res


def run_all(
    plan: list[tuple[str, str]],
    args: list[str],
    rounds: int,
    paths: dict[str, str | None],
    timeout: int,
) -> list[dict[str, Any]]:
    """Every case once per round, the order rotating from round to round."""
    samples = []
    for r in range(rounds):
        shift = r % len(plan)
        for scenario, mode in plan[shift:] + plan[:shift]:
            path = paths["stock" if mode == "stock" else "um"]
            res = _case(scenario, mode, args, path, timeout)
            print(f"round {r + 1}/{rounds} {describe(res)}", flush=True)
            samples.append(res)
    return samples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated: listing1, checkpoint (or checkpoint-fits, checkpoint-2x, "
        "checkpoint-map-cuda), dataloader (default: all)",
    )
    ap.add_argument("--modes", default=None, help="comma-separated subset (default: all)")
    ap.add_argument("--listing-gib", type=float, default=16.0, help="listing 1's tensor")
    ap.add_argument("--listing-budget-gib", type=float, default=8.0, help="its device budget")
    ap.add_argument("--batch-mib", type=float, default=64.0, help="dataloader batch size")
    ap.add_argument("--batches", type=int, default=40, help="dataloader batches")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per worker")
    ap.add_argument("--workdir", default=None, help="checkpoint folder (default: temporary)")
    ap.add_argument("--stock-pythonpath", default=None, help="PYTHONPATH of a stock torch")
    ap.add_argument("--um-pythonpath", default=None, help="PYTHONPATH of a +um torch")
    ap.add_argument("--out", default=None, help="results folder (default bench/results)")
    a = ap.parse_args(argv)
    s = parse_settings(a.listing_gib, a.listing_budget_gib, a.batch_mib, a.batches)
    if a.worker:
        if a.mode not in (*MODES, PREPARE):
            raise BenchError(f"worker mode {a.mode!r}: one of {', '.join(MODES)}, {PREPARE}")
        worker(a.scenario, a.mode, s, Path(a.checkpoint) if a.checkpoint else None)
        return 0
    scenarios = selected_scenarios(a.scenarios)
    modes = selected_modes(a.modes)
    plan = cases(scenarios, modes)
    if a.rounds < 1 or a.timeout < 1:
        raise BenchError("--rounds and --timeout must be at least 1")
    args = [
        "--listing-gib",
        str(a.listing_gib),
        "--listing-budget-gib",
        str(a.listing_budget_gib),
        "--batch-mib",
        str(a.batch_mib),
        "--batches",
        str(a.batches),
    ]
    paths = {"stock": a.stock_pythonpath, "um": a.um_pythonpath}
    keep = a.workdir is not None
    workdir = Path(a.workdir).resolve() if keep else Path(tempfile.mkdtemp(prefix="host-memory-"))
    facts: dict[str, Any] | None = None
    try:
        if any(sc in CHECKPOINTS for sc, _ in plan):
            workdir.mkdir(parents=True, exist_ok=True)
            facts = _checkpoint_file(workdir, paths["stock"], a.timeout)
            args += ["--checkpoint", str(workdir / CHECKPOINT)]
        samples = run_all(plan, args, a.rounds, paths, a.timeout)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(samples, plan)
    settings = {
        "scenarios": scenarios,
        "modes": modes,
        "rounds": a.rounds,
        "um_conf": UM_CONF,
        "listing_bytes": s.listing_bytes,
        "listing_budget_bytes": s.listing_budget,
        "listing_chunk_elements": CHUNK,
        "batch_bytes": s.batch_bytes,
        "batches": s.batches,
        "loader_workers": LOADER_WORKERS,
        "checkpoint": None
        if facts is None
        else {k: facts[k] for k in ("config", "bytes", "params", "torch", "transformers")},
    }
    rec = record(samples, settings, summary)
    print("\n" + table(summary))
    print("summary: " + json.dumps(summary))
    path = write(record_name(scenarios), rec, Path(a.out) if a.out else None)
    print(f"\nwrote {path}")
    failed = [s for s in samples if "error" in s]
    if failed:
        print(f"\n{len(failed)} worker(s) failed:", flush=True)
        for f in failed:
            print("  " + describe(f))
        return 1
    return 0


if __name__ == "__main__":
    run_main(NAME, main)
