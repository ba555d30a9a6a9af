"""What every benchmark shares: the managed-memory safety cap, the machine record,
worker processes, and the results files.

A benchmark is an orchestrator that runs one short-lived worker process per
measurement (``python -m bench.<name> --worker ...``), so that stock torch and the
+um torch are timed in the same run, each in a process of its own, alternating. A
worker prints one line ``BENCH_RESULT <json>``; the orchestrator collects them,
prints ratios and writes ``bench/results/<name>-<gpu>-<date>.json`` with the
machine, the versions and the command.
"""

from __future__ import annotations

import datetime as _dt
import faulthandler
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

GiB = 1 << 30
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
MARK = "BENCH_RESULT "
# Design notes, section 4: never more managed memory than 80 % of what is free at start.
SAFE_FRACTION = 0.8


class BenchError(RuntimeError):
    """A benchmark could not run; the message says why and what to do."""


def safe_cap(torch: Any) -> tuple[int, int, int]:
    """(free, total, cap): free and total device memory now, and the total-managed cap
    every UM measurement must run under."""
    free, total = torch.cuda.mem_get_info()
    return int(free), int(total), int(free * SAFE_FRACTION)


def um_module(torch: Any, mode: str) -> Any:
    """torch.cuda.um, checked against the mode the worker was started for."""
    um = getattr(torch.cuda, "um", None)
    if mode == "stock":
        if um is not None:
            raise BenchError(
                f"mode 'stock' found torch.cuda.um in {torch.__file__}: point "
                "--stock-pythonpath at an unmodified torch"
            )
        return None
    if um is None or not um.is_available():
        raise BenchError(
            f"mode {mode!r} needs a +um torch, but {torch.__file__} has no UM engine: "
            "point --um-pythonpath at one (bench/README.md)"
        )
    return um


# Counters of torch.cuda.um.predict_stats() that are levels (the predictor's current
# target and lookahead, the streamer's least room), not counts: a phase or step reports
# them as they are at its end.
LEVELS = ("target_bytes", "lookahead_bytes", "low_room_bytes")


def counter_change(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What a phase or step did to the engine's counters: each count's difference, each
    level (LEVELS) as it is after."""
    return {k: v if k.endswith(LEVELS) else v - before.get(k, 0) for k, v in after.items()}


def cpu_canary() -> float:
    """Seconds a fixed piece of pure-Python work takes now (about 1 ms on a GPU host's CPU at
    full speed): the speed of this CPU. The virtual machines' CPUs slow down by 1.5-2.2x at
    times (bench/README step 25); run it while nothing else of the process works."""
    t = time.perf_counter()
    x = 0
    for i in range(20000):
        x += i * i % 7
    return time.perf_counter() - t


FULL_SPEED = 1.25  # ran at full CPU speed: a canary at most this times the fastest one seen


def at_full_speed(pairs: Iterable[tuple[float, float]], fastest: float) -> list[float]:
    """The times of ``(time, canary)`` pairs that ran at full CPU speed: their canary at
    most FULL_SPEED times ``fastest``, the fastest canary of everything compared (a
    machine whose CPU slows down slows a host-bound step with it, bench/README step 25)."""
    limit = FULL_SPEED * fastest
    return [t for t, c in pairs if c <= limit]


def emit(result: dict[str, Any]) -> None:
    """The worker's answer: one line on stdout."""
    print(MARK + json.dumps(result), flush=True)


def worker_command(module: str, args: list[str]) -> list[str]:
    """``python -m module --worker args`` with this interpreter."""
    return [sys.executable, "-m", module, "--worker", *args]


def worker_result(cmd: list[str], returncode: int, stdout: str, stderr: str = "") -> Any:
    """What the worker emitted (its last result line), or a BenchError with its output."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise BenchError(
        f"worker {shlex.join(cmd[1:])} gave no result (exit {returncode}):\n"
        + scrub_paths(stdout + stderr)[-3000:]
    )


def scrub_paths(text: str) -> str:
    """``text`` with the paths of the machine it came from made relative (records are
    committed): the repository's to the repository, an installed package's to
    ``site-packages/``, a torch staged by tests/gpu/stage_torch.py to ``stage/``."""
    text = text.replace(str(REPO) + os.sep, "")
    text = re.sub(r'"[^"\n]*?/(?:site|dist)-packages/', '"site-packages/', text)
    return re.sub(r'"[^"\n]*?/torch-um-stage\.[^/"\n]+/', '"stage/', text)


def error_text(limit: int = 4000) -> str:
    """The current exception's traceback for a record: its last ``limit`` characters, paths
    scrubbed."""
    return scrub_paths(traceback.format_exc())[-limit:]


def cell(value: float | None, fmt: str) -> str:
    """``format(value, fmt)`` for a table, or ``-`` in the same width for None."""
    if value is None:
        width = re.match(r"\d*", fmt)
        return "-".rjust(int(width[0] or 0) if width else 0)
    return format(value, fmt)


def last_line(text: str) -> str:
    """The last line of a worker's error text, for a one-line note."""
    return (str(text).strip().splitlines() or ["?"])[-1][:200]


# Seconds a worker past its time gets to print its threads' stacks (run_main registers
# faulthandler for STACKS_SIGNAL) before it is killed.
STACKS_SIGNAL = signal.SIGUSR1
STACKS_GRACE_S = 3  # faulthandler writes from its signal handler at once


def _finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """What ``proc`` still prints within STACKS_GRACE_S; then it is killed, and if a child
    that inherited its pipes keeps them open, they are closed unread."""
    for last in (False, True):
        try:
            out, err = proc.communicate(timeout=STACKS_GRACE_S)
            return out or "", err or ""
        except subprocess.TimeoutExpired:
            if last:
                break
            proc.kill()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    proc.wait()
    return "", ""


def communicate_all(procs: list[subprocess.Popen[str]], timeout: float) -> list[tuple[str, str]]:
    """Each process's (stdout, stderr) once all have ended, within ``timeout`` seconds in
    all. Past it, every process still running is asked for its threads' Python stacks
    (STACKS_SIGNAL), given STACKS_GRACE_S and killed, and subprocess.TimeoutExpired is
    raised with what they all printed, so that a hung worker says where it hung (one probe
    process of bench/README.md step 25 hung after glibc reported a corrupted heap; in a
    hung DDP run the telling stack may be another rank's)."""
    deadline = time.monotonic() + timeout
    done: list[tuple[str, str] | None] = [None] * len(procs)
    try:
        for i, proc in enumerate(procs):
            # at least a moment each, so that output already written is read in full
            out, err = proc.communicate(timeout=max(0.5, deadline - time.monotonic()))
            done[i] = (out or "", err or "")
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(STACKS_SIGNAL)
        printed = []
        for i, proc in enumerate(procs):
            out, err = done[i] or _finish(proc)
            head = f"--- process {i} ---\n" if len(procs) > 1 else ""
            printed.append(head + out + err)
        raise subprocess.TimeoutExpired(
            procs[0].args, timeout, output="".join(printed), stderr=""
        ) from None
    return [d for d in done if d is not None]


def timeout_text(e: subprocess.TimeoutExpired, limit: int = 3000) -> str:
    """What the worker printed (its stacks; the last ``limit`` characters), then
    "timed out after N s" as the last line, which one-line summaries show."""

    def text(v: str | bytes | None) -> str:
        return v.decode(errors="replace") if isinstance(v, bytes) else (v or "")

    printed = scrub_paths(text(e.output) + text(e.stderr)).strip()
    last = f"timed out after {e.timeout:g} s" + (" (stacks above)" if printed else "")
    return (printed[-limit:] + "\n" if printed else "") + last


def run_worker(module: str, args: list[str], pythonpath: str | None, timeout: int) -> Any:
    """Run ``python -m module --worker args`` and return what it emitted."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_UM_CONF", None)  # each worker configures the engine itself
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, str(REPO)) if p)
    cmd = worker_command(module, args)
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    ((out, err),) = communicate_all([proc], timeout)
    return worker_result(cmd, proc.returncode, out, err)


def run_worker_safely(
    module: str, args: list[str], pythonpath: str | None, timeout: int, base: dict[str, Any]
) -> dict[str, Any]:
    """run_worker, its result over ``base``; a crash or a timeout becomes ``base`` with an
    ``error``, so that one failed case does not end a benchmark."""
    try:
        res: dict[str, Any] = run_worker(module, args, pythonpath, timeout)
        return {**base, **res}
    except subprocess.TimeoutExpired as e:
        return {**base, "error": timeout_text(e)}
    except (BenchError, json.JSONDecodeError) as e:
        return {**base, "error": str(e)}


def run_rounds(
    module: str,
    cases: list[tuple[str, list[str]]],
    rounds: int,
    pythonpaths: dict[str, str | None],
    describe: Callable[[dict[str, Any]], str],
    timeout: int = 600,
) -> list[dict[str, Any]]:
    """Every case (mode, worker arguments) once per round, in an order that rotates
    from round to round, each in a worker process; the workers' results in run order.
    ``pythonpaths`` maps a mode to the PYTHONPATH its torch is found through."""
    samples = []
    for r in range(rounds):
        shift = r % len(cases)
        for mode, args in cases[shift:] + cases[:shift]:
            res = run_worker(module, ["--mode", mode, *args], pythonpaths.get(mode), timeout)
            print(f"round {r + 1}/{rounds} {describe(res)}", flush=True)
            samples.append(res)
    return samples


def machine(torch: Any) -> dict[str, Any]:
    """The GPU, driver, versions and host a result was measured on."""
    props = torch.cuda.get_device_properties(0)
    smi = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=driver_version,pcie.link.gen.max,pcie.link.width.max",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
    )
    rev, modified = repository_state()
    um = getattr(torch.cuda, "um", None)
    engine = um.engine_library() if um is not None else None
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpu_memory_gib": round(props.total_memory / GiB, 1),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "nvidia_smi": smi.stdout.strip() if smi.returncode == 0 else "unavailable",
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        # The engine (libtorch_um.so or libc10_cuda.so): a stock torch staged with the +um
        # bundle keeps its own version string, so the engine is what tells the two apart.
        "um_engine": os.path.basename(engine) if engine else None,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs",
        "repository_commit": rev or "unknown",
        # tracked files that differ from that commit (None: not known)
        "repository_modified": modified,
    }


def repository_state() -> tuple[str, bool | None]:
    """The commit the measured tree is, and whether tracked files differ from it.

    TORCH_UM_COMMIT, when set, names the commit: the GPU host's copy of the tree may carry
    a .git from an earlier copy, whose HEAD is not the tree's (seen in step 42's records,
    which name 69c8e33 for later trees). Then whether the tree differs is not known."""
    told = os.environ.get("TORCH_UM_COMMIT", "").strip()
    if told:
        return told, None
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if git.returncode != 0:
        return "", None
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    return git.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


def write(name: str, record: dict[str, Any], out: Path | None = None) -> Path:
    """<out, default bench/results>/<name>-<gpu>-<date>.json, written atomically."""
    out = out or RESULTS
    gpu = re.sub(r"[^a-z0-9]+", "-", record["machine"]["gpu"].lower()).strip("-")
    gpu = gpu.removeprefix("nvidia-")
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d")
    record = {"benchmark": name, "date": date, **record}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{gpu}-{date}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    return path


PATH_OPTIONS = {
    "--stock-pythonpath": "STOCK",
    "--um-pythonpath": "UM",
    "--prev-pythonpath": "PREV",
    "--out": "OUT",
    "--workdir": "WORKDIR",
    "--json": "FILE",  # a probe's output file
}


def command_line(module: str) -> str:
    """How this orchestrator was started, for the record: the values of path options
    are replaced by their names (STOCK, UM, PREV, OUT, WORKDIR), which bench/README.md
    explains."""
    args = list(sys.argv[1:])
    for i, arg in enumerate(args[:-1]):
        if arg in PATH_OPTIONS:
            args[i + 1] = PATH_OPTIONS[arg]
    return shlex.join(["python", "-m", module, *args])


def save(
    name: str,
    samples: list[dict[str, Any]],
    settings: dict[str, Any],
    summary: dict[str, Any],
    out: str | None,
) -> Path:
    """The record of one orchestrator run: command, machine (of the stock workers), the
    +um torch and engine, settings, summary and every sample; returns the file."""
    stock = next(s for s in samples if s["mode"].startswith("stock"))
    um = next(s for s in samples if s["mode"] == "um")
    record = {
        "command": command_line(f"bench.{name}"),
        "machine": stock["machine"],
        "um_torch": um["machine"]["torch"],
        "um_engine": um["machine"]["um_engine"],
        "settings": settings,
        "summary": summary,
        "samples": [{k: v for k, v in s.items() if k != "machine"} for s in samples],
    }
    path = write(name, record, Path(out) if out else None)
    print(f"\nwrote {path}")
    return path


def _enable_stacks() -> None:
    """faulthandler on the process's own stderr (sys.__stderr__: pytest's capture of
    sys.stderr has no file descriptor); nothing where there is none."""
    err = sys.__stderr__
    try:
        if err is None:
            return
        err.fileno()
    except (OSError, ValueError):
        return
    faulthandler.enable(file=err, all_threads=True)
    faulthandler.register(STACKS_SIGNAL, file=err, all_threads=True)


def run_main(name: str, main: Callable[[], int]) -> NoReturn:
    """``python -m bench.<name>``: a BenchError is one line on stderr and exit status 1.
    A crash (a fatal signal: glibc aborting on a corrupted heap) prints every thread's
    Python stack, and so does STACKS_SIGNAL (sent to a worker past its time)."""
    _enable_stacks()
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"bench.{name}: {e}", file=sys.stderr)
        sys.exit(1)
