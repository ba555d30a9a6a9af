"""Plots of the newest results of each benchmark: bench/results/<name>-...png.

    python -m bench.plot [RESULT.json ...]

Without arguments: the newest JSON file of each benchmark (step_time, oversubscribe,
residency-train, residency-infer, residency-generate, residency-ddp) in bench/results/.
Needs matplotlib (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench import models
from bench.common import RESULTS, BenchError


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise BenchError(f"plots need matplotlib: pip install -e '.[bench]' ({e})") from e
    return plt


def _title(record: dict[str, Any]) -> str:
    m = record["machine"]
    # Results before um_engine was recorded came from the injection bundle's engine.
    engine = record.get("um_engine") or "libtorch_um.so"
    return (
        f"{m['gpu']}, {record['date']}: um = torch {record['um_torch']} with {engine}, "
        f"stock = torch {m['torch']}"
    )


def _save(plt: Any, fig: Any, dest: Path) -> None:
    fig.tight_layout()
    fig.savefig(dest, dpi=120)
    plt.close(fig)


def plot_step_time(record: dict[str, Any], dest: Path) -> None:
    plt = _pyplot()
    summary = record["summary"]
    models = list(summary)
    # The modes that ran (the record's settings name them; older records ran these three).
    modes = record.get("settings", {}).get("modes") or ["stock", "um-off", "um"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        values = [summary[m][mode]["best_ms"] if mode in summary[m] else 0 for m in models]
        offset = (i - (len(modes) - 1) / 2) * width
        bars = ax.bar([x + offset for x in range(len(models))], values, width, label=mode)
        for bar, model in zip(bars, models, strict=True):
            ratio = summary[model].get(f"{mode}/stock", {}).get("best_ms")
            if ratio is not None:
                ax.annotate(
                    f"{ratio:.3f}x",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("training step, best worker median (ms)")
    ax.set_title("Step time, data fits on the GPU\n" + _title(record), fontsize=9)
    ax.legend()
    _save(plt, fig, dest)


def plot_oversubscribe(record: dict[str, Any], dest: Path) -> None:
    plt = _pyplot()
    seconds = record["summary"]["seconds"]
    phases = ["copy_in", "square", "copy_out"]
    runs = ["first", "again"]
    fig, axes = plt.subplots(1, len(runs), figsize=(10, 4), sharey=True)
    width = 0.27
    for ax, run in zip(axes, runs, strict=True):
        for i, mode in enumerate(seconds):
            values = [seconds[mode][run][p]["seconds"] for p in phases]
            x = [k + (i - 1) * width for k in range(len(phases))]
            ax.bar(x, values, width, label=mode)
        ax.set_xticks(range(len(phases)), phases)
        ax.set_title(f"{run} run", fontsize=9)
    axes[0].set_ylabel("seconds (median of rounds)")
    axes[0].legend()
    settings = record["settings"]
    fig.suptitle(
        f"{settings['tensor_bytes'] / 2**30:.0f} GiB tensor, device budget "
        f"{settings['budget_bytes'] / 2**30:.0f} GiB\n" + _title(record),
        fontsize=9,
    )
    _save(plt, fig, dest)


def plot_residency(record: dict[str, Any], dest: Path) -> None:
    """bench.residency: median step seconds per mode (log scale), the PCIe floor as a
    line, each bar labelled with its ratio to the floor; OOM / not run marked."""
    plt = _pyplot()
    summary = record["summary"]
    floor = summary["floor_s"]
    modes = list(summary["modes"])
    rows = record.get("analysis", {}).get("modes", {})
    fig, ax = plt.subplots(figsize=(1.3 * len(modes) + 3, 4.2))
    values = [summary["modes"][m] for m in modes]
    known = [v for v in values if v is not None]
    bottom = min([*known, floor or 1.0]) / 2 if known else 1.0
    bars = ax.bar(range(len(modes)), [v if v is not None else 0 for v in values], 0.6)
    for i, (bar, mode, value) in enumerate(zip(bars, modes, values, strict=True)):
        if value is None:
            row = rows.get(mode, {})
            text = "OOM" if row.get("oom") else "error" if row.get("errors") else "not run"
            ax.annotate(text, (i, bottom * 1.1), ha="center", va="bottom", fontsize=8, color="red")
            continue
        label = f"{value:.3g} s" + (f"\n{value / floor:.2f}x floor" if floor else "")
        ax.annotate(
            label,
            (bar.get_x() + bar.get_width() / 2, value),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    if floor:
        ax.axhline(floor, color="black", linestyle="--", linewidth=1)
        ax.annotate(
            f"PCIe floor {floor:.3g} s",
            (len(modes) - 0.5, floor),
            ha="right",
            va="bottom",
            fontsize=8,
        )
    ax.set_yscale("log")
    # Room above the tallest bar for its two-line label (a log axis: a factor).
    ax.set_ylim(bottom=bottom, top=max(known) * 3 if known else None)
    ax.set_xticks(range(len(modes)), modes, rotation=15, fontsize=8)
    ax.set_ylabel("step, median of rounds (s, log)")
    settings = record["settings"]
    workload = settings["workload"]
    if settings.get("ranks"):  # ddp; records made before --ranks existed ran 2 ranks and do not say
        workload += f" ({settings['ranks']} rank{'s' if settings['ranks'] > 1 else ''})"
    model = models.MODELS.get(settings.get("model", models.DEFAULT))  # older records: GPT-2
    ax.set_title(
        f"{model.about if model else settings['model']}, {workload}, batch "
        f"{' x '.join(map(str, settings['batch']))}, device budget "
        f"{settings['budget_bytes'] / 2**30:.3g} GiB\n" + _title(record),
        fontsize=9,
    )
    _save(plt, fig, dest)


PLOTTERS = {
    "step_time": plot_step_time,
    "oversubscribe": plot_oversubscribe,
    "residency-train": plot_residency,
    "residency-infer": plot_residency,
    "residency-generate": plot_residency,
    "residency-ddp": plot_residency,
}


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv]
    if not files:
        for name in PLOTTERS:
            found = sorted(RESULTS.glob(f"{name}-*.json"), key=lambda p: p.stat().st_mtime)
            files += found[-1:]
    if not files:
        raise BenchError(f"no results in {RESULTS}: run a benchmark first (bench/README.md)")
    for path in files:
        record = json.loads(path.read_text())
        plot = PLOTTERS.get(record.get("benchmark", ""))
        if plot is None:
            raise BenchError(f"{path}: not a result of {', '.join(PLOTTERS)}")
        dest = path.with_suffix(".png")
        plot(record, dest)
        print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BenchError as e:
        print(f"bench.plot: {e}", file=sys.stderr)
        sys.exit(1)
