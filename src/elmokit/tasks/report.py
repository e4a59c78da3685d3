"""Result tables (Markdown and JSON, mean ± standard deviation over seeds) and the learned layer-weight plot.

A table row is a dict: column → a string, a number, or a list of per-seed numbers (shown as ``mean ± std``). Files
are written atomically (:mod:`elmokit.io`): an interrupted write leaves the old file or none.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from elmokit.errors import InputError, UsageError, import_optional
from elmokit.io import atomic_path, atomic_write_text

__all__ = [
    "mean_std",
    "format_mean_std",
    "format_cell",
    "results_table",
    "write_results",
    "softmax",
    "format_layer_weights",
    "plot_layer_weights",
]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and *sample* standard deviation (ddof = 1, as over a few seeds) of ``values``; the std of one value is 0.

    Raises :class:`InputError` for no values or a value that is not a finite number."""
    vals = [float(v) for v in values]
    if not vals:
        raise InputError("mean_std of no values")
    if not all(math.isfinite(v) for v in vals):
        raise InputError(f"mean_std: not all values are finite numbers: {vals}")
    n = len(vals)
    mean = sum(vals) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))


def format_mean_std(mean: float, std: float, digits: int = 1) -> str:
    """``92.1 ± 0.3`` (``digits`` decimals)."""
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def format_cell(value: object, digits: int = 1) -> str:
    """One table cell: a list/tuple of numbers → ``mean ± std`` over them (one value: just the value), a float →
    ``digits`` decimals, ``None`` → ``—``, anything else → ``str``."""
    if value is None:
        return "—"
    if isinstance(value, (list, tuple)):
        if len(value) == 1:
            return f"{float(value[0]):.{digits}f}"
        return format_mean_std(*mean_std(value), digits=digits)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _columns(rows: Sequence[Mapping], columns: Sequence | None) -> list[tuple[str, str]]:
    """``columns`` as ``(key, header)`` pairs: a key alone is its own header; ``None`` → every key in first-seen
    order."""
    if columns is None:
        seen: dict[str, None] = {}
        for row in rows:
            seen.update(dict.fromkeys(row))
        columns = list(seen)
    out = []
    for c in columns:
        if isinstance(c, str):
            out.append((c, c))
        elif isinstance(c, (tuple, list)) and len(c) == 2 and all(isinstance(x, str) for x in c):
            out.append((c[0], c[1]))
        else:
            raise UsageError(f"a column is a key or a (key, header) pair of strings, got {c!r}")
    return out


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def results_table(rows: list[dict], columns: Sequence | None = None, *, digits: int = 1) -> str:
    """A Markdown table: one line per row, cells by :func:`format_cell` (a list of per-seed values becomes
    ``mean ± std``); a key a row lacks gives ``—``. ``columns``: keys or ``(key, header)`` pairs, in order (default:
    all keys in first-seen order). Numbers are right-aligned. Returns the table text ending in a newline."""
    cols = _columns(rows, columns)
    if not cols:
        raise UsageError("results_table: no columns")
    numeric = [
        any(isinstance(r.get(k), (int, float, list, tuple)) and not isinstance(r.get(k), bool) for r in rows)
        for k, _ in cols
    ]
    lines = [
        "| " + " | ".join(_escape(h) for _, h in cols) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_escape(format_cell(row.get(k), digits)) for k, _ in cols) + " |")
    return "\n".join(lines) + "\n"


def _json_value(value: object) -> object:
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        mean, std = mean_std(value)
        return {"values": [float(v) for v in value], "mean": mean, "std": std}
    return value


def write_results(
    path_stem: str | os.PathLike,
    table_rows: list[dict],
    meta: dict,
    *,
    columns: Sequence | None = None,
    digits: int = 1,
) -> tuple[Path, Path]:
    """Write ``<stem>.md`` (``meta["title"]`` as a heading if present, the :func:`results_table`, then each other
    ``meta`` entry as a ``- key: value`` line) and ``<stem>.json`` (``{"meta": meta, "rows": rows}``, each list of
    per-seed numbers stored as ``{"values", "mean", "std"}``), each atomically. ``columns`` default:
    ``meta["columns"]`` if present, else every key. Returns the two paths.

    Raises :class:`UsageError` when ``meta`` cannot be written as JSON."""
    stem = Path(path_stem)
    if columns is None:
        columns = meta.get("columns")
    table = results_table(table_rows, columns, digits=digits)
    parts = []
    if meta.get("title"):
        parts.append(f"# {meta['title']}\n")
    parts.append(table)
    try:
        data = json.dumps(
            {"meta": meta, "rows": [{k: _json_value(v) for k, v in r.items()} for r in table_rows]},
            indent=2,
            ensure_ascii=False,
            allow_nan=False,
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"write_results: the rows/meta cannot be written as JSON ({exc})") from None
    notes = [
        f"- {k}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
        for k, v in meta.items()
        if k not in ("title", "columns")
    ]
    if notes:
        parts.append("\n".join(notes) + "\n")
    md, js = stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".json")
    atomic_write_text(md, "\n".join(parts))
    atomic_write_text(js, data + "\n")
    return md, js


def softmax(s: Sequence[float]) -> list[float]:
    """softmax(s)_j = exp(s_j) / Σ_k exp(s_k) (max-shifted), as ScalarMix normalises its weights."""
    vals = [float(v) for v in s]
    if not vals:
        raise InputError("softmax of no values")
    m = max(vals)
    e = [math.exp(v - m) for v in vals]
    total = sum(e)
    return [v / total for v in e]


def format_layer_weights(s: Sequence[float], gamma: float, digits: int = 3) -> str:
    """``softmax(s) = [0.212, 0.345, 0.443], γ = 1.234`` — the learned mix of one ScalarMix, for logs and notes."""
    w = ", ".join(f"{v:.{digits}f}" for v in softmax(s))
    return f"softmax(s) = [{w}], γ = {float(gamma):.{digits}f}"


def plot_layer_weights(
    weights: dict[str, list[float]], gammas: dict[str, float], path: str | os.PathLike, title: str
) -> Path:
    """Bar chart of the learned layer weights, one group of bars per biLM layer (0 = token layer … L = top), one bar
    colour per row/task, written as a PNG atomically (matplotlib, Agg canvas, no pyplot state).

    Args:
        weights: row name → the ScalarMix's *raw* scalar parameters s (one per layer, L+1; e.g.
            ``mix.scalar_vector.tolist()``); the bars show softmax(s) — the normalised weights the mix applies.
        gammas: row name → the mix's γ (shown in the legend; a row missing here shows none).
        path: the PNG to write. title: the figure title.

    Raises :class:`UsageError` for no rows or rows of different layer counts. Returns ``path``.

    Source: the layer-weight figures of Peters et al. (2018), section 5.2."""
    if not weights:
        raise UsageError("plot_layer_weights: no rows to plot")
    sizes = {len(v) for v in weights.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise UsageError(f"plot_layer_weights: every row needs the same number of layers, got {sorted(sizes)}")
    backend = import_optional("matplotlib.backends.backend_agg", "plots", "plot_layer_weights")  # optional
    FigureCanvasAgg = backend.FigureCanvasAgg
    from matplotlib.figure import Figure  # optional: matplotlib (present: imported just above)

    n_layers = sizes.pop()
    names = list(weights)
    width = 0.8 / len(names)
    fig = Figure(figsize=(max(4.0, 1.3 * n_layers + 0.4 * len(names)), 3.4), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for k, name in enumerate(names):
        w = softmax(weights[name])
        xs = [j - 0.4 + width * (k + 0.5) for j in range(n_layers)]
        label = name if name not in gammas else f"{name} (γ = {float(gammas[name]):.2f})"
        ax.bar(xs, w, width=width * 0.95, label=label)
    ax.axhline(1.0 / n_layers, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(n_layers))
    ax.set_xticklabels(["0 (tokens)"] + [str(j) for j in range(1, n_layers)])
    ax.set_xlabel("biLM layer")
    ax.set_ylabel("softmax(s)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    return path
