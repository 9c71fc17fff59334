"""matplotlib helpers (Agg backend). Every function returns False if charts are unavailable."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# matplotlib is imported on first use only (it is slow to import).
HAVE = importlib.util.find_spec("matplotlib") is not None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

COLORS = {
    "veloxy": "#d62728", "nginx": "#2ca02c", "haproxy": "#1f77b4", "envoy": "#9467bd",
    "caddy": "#17becf", "pingora": "#ff7f0e", "traefik": "#8c564b", "direct": "#7f7f7f",
}


def _color(name: str):
    return COLORS.get(name)


def _kilo(v: float) -> str:
    return f"{v / 1000:.1f}k" if v >= 1000 else f"{v:.0f}"


def grouped_bars(path: Path, title: str, ylabel: str, groups: list[str],
                 series: dict[str, list[float | None]], fmt=_kilo) -> bool:
    """groups = x categories (e.g. proxies); series = label -> one value per group;
    fmt(value) labels each bar."""
    if not HAVE or not groups or not series:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) + 2), 4.2), dpi=110)
    n = len(series)
    width = 0.8 / n
    for i, (label, vals) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ys = [v or 0 for v in vals]
        bars = ax.bar(xs, ys, width, label=label)
        for b, v in zip(bars, vals, strict=True):
            if v:
                ax.annotate(fmt(v),
                            (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    if n > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def lines(path: Path, title: str, xlabel: str, ylabel: str,
          series: dict[str, list[tuple[float, float | None]]], logy: bool = False,
          logx: bool = False, zero: bool = False) -> bool:
    """series = proxy -> [(x, y), ...]; one line per proxy. `zero`: the y axis starts at 0."""
    if not HAVE or not series:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    plotted = False
    for name, pts in series.items():
        pts = [(x, y) for x, y in pts if y is not None and (y > 0 or not logy)]
        if not pts:
            continue
        xs, ys = zip(*sorted(pts), strict=True)
        ax.plot(xs, ys, marker="o", markersize=3, label=name, color=_color(name),
                linewidth=2.2 if name == "veloxy" else 1.4)
        plotted = True
    if not plotted:
        plt.close(fig)
        return False
    if logy:
        ax.set_yscale("log")
    if logx:
        ax.set_xscale("log")
    if zero and not logy:
        ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
