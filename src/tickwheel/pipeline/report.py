"""``tickwheel pipeline report``: the summary table and PNG plots of a run's output.

Plots (matplotlib, Agg backend, written to ``<output>/plots/``):

* ``latency.png``: a histogram of ``latency_ms`` per outcome;
* ``expirations.png``: expirations over event time (per-minute counts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["load_summary", "read_output", "render_summary", "write_plots"]


def load_summary(output_dir: str | Path) -> dict[str, Any]:
    """Read ``summary.json`` of a run; FileNotFoundError names the directory if missing."""
    path = Path(output_dir) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{output_dir}: no summary.json; is it a pipeline output directory?"
        )
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def render_summary(summary: dict[str, Any]) -> str:
    """The summary as an aligned text table. O(size of the summary)."""
    counts = summary["counts"]
    lines = [
        f"input      {summary['input']}  ({summary['input_files']} files)",
        f"output     {summary['output']}  ({summary['format']})",
        "rules      "
        + ", ".join(
            f"{r['name']} (key {r['key']}, timeout {r['timeout_ms']:,} ms)"
            for r in summary["rules"]
        ),
        f"watermark  {summary['watermark']}  (max event time {summary['max_event_time']}, "
        f"allowed lateness {summary['allowed_lateness_ms']:,} ms)",
        "",
        f"{'records':<28}{counts['records']:>12,}",
        f"{'  rejected':<28}{counts['rejected']:>12,}",
    ]
    for reason, n in counts["rejected_by_reason"].items():
        lines.append(f"{'    ' + reason:<28}{n:>12,}")
    lines += [
        f"{'  duplicates (counted)':<28}{counts['duplicates']:>12,}",
        f"{'  events (deduplicated)':<28}{counts['events']:>12,}",
        f"{'    ignored (no rule)':<28}{counts['ignored']:>12,}",
        f"{'    buffered (> watermark)':<28}{counts['buffered']:>12,}",
        "",
        f"{'outcome':<14}{'count':>12}{'p50 ms':>14}{'p90 ms':>14}{'p99 ms':>14}",
    ]
    for outcome, n in counts["outcomes"].items():
        lat = summary["latency_ms"].get(outcome) or {}
        cells = "".join(
            f"{lat[p]:>14,.0f}" if lat.get(p) is not None else f"{'-':>14}"
            for p in ("p50", "p90", "p99")
        )
        lines.append(f"{outcome:<14}{n:>12,}{cells}")
    lines.append("")
    for reason, n in counts["unmatched"].items():
        lines.append(f"{'unmatched ' + reason:<28}{n:>12,}")
    loop = summary["loop"]
    lines += [
        "",
        f"{'partitions':<28}{summary['partitions']:>12}",
        f"{'job seconds':<28}{summary['seconds']:>12,.1f}",
        f"{'records/s':<28}{summary['events_per_s'] or 0:>12,.0f}",
        f"{'purgatory loop events/s':<28}{loop['events_per_s'] or 0:>12,.0f}  (one core)",
    ]
    return "\n".join(lines) + "\n"


def read_output(output_dir: str | Path, name: str, fmt: str = "parquet") -> Any:
    """One output (``outcomes``, ``unmatched``, ...) as a pandas DataFrame."""
    import pandas as pd  # type: ignore[import-untyped]

    path = Path(output_dir) / name
    if fmt == "parquet":
        return pd.read_parquet(path)
    files = sorted(p for p in path.glob("part-*") if p.is_file())
    if not files:
        return pd.DataFrame()
    if fmt == "csv":
        return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    return pd.concat([pd.read_json(f, lines=True) for f in files], ignore_index=True)


def write_plots(output_dir: str | Path, fmt: str = "parquet") -> list[Path]:
    """Write the latency histogram and the expirations-over-time plot; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(output_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    outcomes = read_output(output_dir, "outcomes", fmt)
    paths = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    if len(outcomes):
        resolved = outcomes[outcomes["outcome"] != "pending"]
        # One set of bin edges for every outcome: per-outcome bins would squeeze
        # the expirations (all at exactly the timeout) into an invisible sliver.
        longest = float(resolved["latency_ms"].max() / 1000.0) if len(resolved) else 1.0
        edges = [longest * i / 60 for i in range(61)] if longest > 0 else 60
        # Outlines on a log scale: filled bars hid the cancellations (a few
        # hundred per bin) behind the completions (thousands per bin).
        for outcome, group in sorted(resolved.groupby("outcome")):
            seconds = group["latency_ms"].astype("float64") / 1000.0
            ax.hist(
                seconds,
                bins=edges,
                histtype="step",
                linewidth=1.5,
                label=f"{outcome} ({len(group):,})",
            )
        ax.set_yscale("log")
        ax.legend()
    ax.set_xlabel("latency (s): resolved_at - opened_at")
    ax.set_ylabel("operations (log scale)")
    ax.set_title("Latency per outcome")
    fig.tight_layout()
    paths.append(out / "latency.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    if len(outcomes):
        expired = outcomes[outcomes["outcome"] == "expired"]
        if len(expired):
            minute = (expired["resolved_at"].astype("int64") // 60_000) * 60_000
            per_minute = minute.value_counts().sort_index()
            import pandas as pd

            ax.plot(pd.to_datetime(per_minute.index, unit="ms", utc=True), per_minute.values)
    ax.set_xlabel("event time (UTC)")
    ax.set_ylabel("expirations per minute")
    ax.set_title("Expirations over time")
    fig.autofmt_xdate()
    fig.tight_layout()
    paths.append(out / "expirations.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths
