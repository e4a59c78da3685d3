"""Polysemy tools: a word's occurrences, their contextual vectors per layer, cosine similarities, nearest contextual
neighbours in a corpus, and a 2-D projection plot (``elmokit similar``).

The point (Peters et al., 2018, §5.3 and Table 4): layer 0 of a biLM is context-free — every occurrence of a word gets
the same vector, so its pairwise cosine is 1 — while the biLSTM layers give each occurrence its own vector, and
occurrences of the same sense end up closer to each other than to those of other senses.

**Matching a word in a sentence** and the occurrences' vectors: :mod:`elmokit.analysis.occurrences` (importable
from here too).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elmokit.analysis.cjk_fonts import cjk_font, missing_glyphs, romanised
from elmokit.analysis.occurrences import (
    MATCH_MODES,
    Occurrence,
    context_window,
    find_occurrences,
    find_spans,
    occurrence_vectors,
)
from elmokit.data.text_checks import is_cjk  # noqa: F401 (kept here too; its home is elmokit.data.text_checks)
from elmokit.errors import InputError, UsageError, import_optional
from elmokit.io import atomic_path

__all__ = [
    "MATCH_MODES",
    "Occurrence",
    "Neighbour",
    "is_cjk",
    "find_spans",
    "find_occurrences",
    "context_window",
    "occurrence_vectors",
    "cosine_matrix",
    "layer_similarities",
    "label_similarity",
    "nearest_neighbours",
    "pca_2d",
    "plot_scale",
    "plot_occurrences",
    "PLOT_FORMATS",
    "plot_format",
    "is_elmokit_plot",
    "cjk_font",
    "romanised",
    "missing_glyphs",
    "layer_names",
]

logger = logging.getLogger(__name__)

#: The plot formats :func:`plot_occurrences` writes, by the path's suffix (any case).
PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
#: What a plot elmokit wrote says it was made by (PNG ``Software``, SVG and PDF ``Creator``; :func:`is_elmokit_plot`).
PLOT_CREATOR = "elmokit plot"
_PLOT_METADATA_KEY = {"png": "Software", "svg": "Creator", "pdf": "Creator"}
_PLOT_SIGNATURES = {"png": (b"\x89PNG\r\n\x1a\n",), "pdf": (b"%PDF-",), "svg": (b"<?xml", b"<svg")}


def _normalise(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x, dtype=np.float64), where=norm > 0)


def cosine_matrix(x: np.ndarray) -> np.ndarray:
    """(N, D) vectors → (N, N) float64 cosine similarities ``x_i·x_j / (|x_i| |x_j|)``; a zero vector has cosine 0
    with everything (itself included).

    Raises:
        InputError: ``x`` is not 2-D."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise InputError(f"cosine_matrix expects (N, D) vectors, got shape {x.shape}")
    u = _normalise(x)
    return u @ u.T


def layer_names(num_layers: int, average: bool = True) -> list[str]:
    """Row names for L+1 layers (``"0 (static)"``, ``"1"``, …) and ``"average"``."""
    return ["0 (static)"] + [str(k) for k in range(1, num_layers)] + (["average"] if average else [])


def layer_similarities(vectors: np.ndarray, average: bool = True) -> np.ndarray:
    """(N, L+1, D) occurrence vectors → (L+1 [+1], N, N) cosine matrices per layer; with ``average`` a last one for
    the layer average (the mean of the L+1 layers' vectors, ``elmokit embed --average``).

    Raises:
        InputError: ``vectors`` is not 3-D."""
    v = np.asarray(vectors)
    if v.ndim != 3:
        raise InputError(f"layer_similarities expects (N, L+1, D) vectors, got shape {v.shape}")
    mats = [cosine_matrix(v[:, k]) for k in range(v.shape[1])]
    if average:
        mats.append(cosine_matrix(v.mean(axis=1)))
    return np.stack(mats) if mats else np.zeros((0, v.shape[0], v.shape[0]))


def label_similarity(sim: np.ndarray, labels: Sequence[object] | None = None) -> dict[str, float | int | None]:
    """Summary of one (N, N) cosine matrix over its off-diagonal pairs i < j: ``pairs``, ``mean``, ``min``, ``max``;
    with ``labels``, ``within`` (mean over pairs with the same label), ``across`` (different labels) and
    ``gap = within - across`` (``None`` where no such pair exists). Unlabelled entries (``None``) are left out of
    within/across: a pair counts only when both of its entries have a label; labels are compared as ``str``.

    Raises:
        InputError: ``sim`` not square, or ``labels`` of another length."""
    sim = np.asarray(sim, dtype=np.float64)
    if sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
        raise InputError(f"label_similarity expects an (N, N) matrix, got shape {sim.shape}")
    n = sim.shape[0]
    iu = np.triu_indices(n, k=1)
    vals = sim[iu]
    out: dict[str, float | int | None] = {
        "pairs": int(vals.size),
        "mean": float(vals.mean()) if vals.size else None,
        "min": float(vals.min()) if vals.size else None,
        "max": float(vals.max()) if vals.size else None,
    }
    if labels is not None:
        if len(labels) != n:
            raise InputError(f"label_similarity: {len(labels)} labels for {n} occurrences")
        # integer codes, -1 for unlabelled: comparing an object array with a sentinel string such as "\0" does not
        # work (numpy turns "\0" into "" before comparing), and a real label must never equal the sentinel
        codes: dict[str, int] = {}
        lab = np.array([-1 if x is None else codes.setdefault(str(x), len(codes)) for x in labels], dtype=np.int64)
        known = (lab[iu[0]] >= 0) & (lab[iu[1]] >= 0)
        same = (lab[iu[0]] == lab[iu[1]]) & known
        diff = (lab[iu[0]] != lab[iu[1]]) & known
        out["within"] = float(vals[same].mean()) if same.any() else None
        out["across"] = float(vals[diff].mean()) if diff.any() else None
        out["gap"] = (out["within"] - out["across"]) if same.any() and diff.any() else None
    return out


@dataclass(frozen=True)
class Neighbour:
    """A corpus token near a query: cosine ``score``, ``sentence`` (0-based index into the corpus), token
    ``position``, and the ``token``."""

    score: float
    sentence: int
    position: int
    token: str


class _RunningTopK:
    """The best ``k`` corpus tokens per query seen so far: ``score`` (Q, ≤k) cosines, ``ref`` (Q, ≤k, 2) their
    (sentence, position), best first (ties: the earlier token), and the tokens of the sentences they point into."""

    def __init__(self, n_queries: int, k: int) -> None:
        self.k = k
        self.score = np.full((n_queries, 0), -np.inf)
        self.ref = np.zeros((n_queries, 0, 2), dtype=np.int64)
        self.tokens_of: dict[int, list[str]] = {}

    def add(self, scores: np.ndarray, ref: np.ndarray, batch: list[tuple[int, list[str]]]) -> None:
        """Merge a chunk's (Q, M) ``scores`` of the tokens ``ref`` (M, 2); keep only the sentences still needed."""
        self.tokens_of.update(batch)
        all_scores = np.concatenate([self.score, scores], axis=1)
        all_ref = np.concatenate([self.ref, np.broadcast_to(ref, (len(scores),) + ref.shape)], axis=1)
        order = np.argsort(-all_scores, axis=1, kind="stable")[:, : self.k]
        self.score = np.take_along_axis(all_scores, order, axis=1)
        self.ref = np.take_along_axis(all_ref, order[..., None], axis=1)
        keep = {int(i) for i in self.ref[..., 0].ravel()}
        self.tokens_of = {i: s for i, s in self.tokens_of.items() if i in keep}

    def neighbours(self) -> list[list[Neighbour]]:
        """Per query, its :class:`Neighbour` s (excluded tokens, scored −inf, left out)."""
        return [
            [
                Neighbour(float(score), int(idx), int(pos), self.tokens_of[int(idx)][int(pos)])
                for score, (idx, pos) in zip(scores, refs)
                if np.isfinite(score)
            ]
            for scores, refs in zip(self.score, self.ref)
        ]


def _check_queries(embedder, queries: np.ndarray, k: int, layer: int | str, exclude: Sequence | None) -> np.ndarray:
    """The (Q, 2P) float64 queries, after checking ``k``, their width, ``exclude``'s length and ``layer``."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise UsageError(f"k (neighbours) must be an int >= 1, got {k!r}")
    q = np.asarray(queries, dtype=np.float64)
    if q.ndim != 2 or q.shape[1] != embedder.output_dim:
        raise UsageError(f"queries must be (Q, {embedder.output_dim}) vectors, got shape {q.shape}")
    if exclude is not None and len(exclude) != len(q):
        raise UsageError(f"exclude holds {len(exclude)} sets for {len(q)} queries")
    embedder.output_spec(layer)  # a bad layer: before any work
    return q


def _sentence_chunks(corpus: Iterable[Sequence[str]], chunk: int) -> Iterator[list[tuple[int, list[str]]]]:
    """``(corpus index, tokens)`` pairs, ``chunk`` sentences at a time."""
    batch: list[tuple[int, list[str]]] = []
    for idx, sentence in enumerate(corpus):
        batch.append((idx, list(sentence)))
        if len(batch) == chunk:
            yield batch
            batch = []
    if batch:
        yield batch


def _chunk_scores(
    embedder, unit_queries: np.ndarray, batch: list[tuple[int, list[str]]], batch_size: int | None, layer: int | str
) -> tuple[np.ndarray, np.ndarray] | None:
    """Cosines (Q, M) of the queries with the M tokens of ``batch`` and their (M, 2) (sentence, position); ``None``
    when the chunk has no token."""
    arrays = list(embedder.embed_sentences([s for _, s in batch], batch_size, layers=layer))
    refs = [(idx, pos) for (idx, s), _ in zip(batch, arrays) for pos in range(len(s))]
    if not refs:
        return None
    m = np.concatenate([a.astype(np.float64) for a in arrays if len(a)], axis=0)
    return unit_queries @ _normalise(m).T, np.array(refs, dtype=np.int64)


def _mask_excluded(
    scores: np.ndarray,
    ref: np.ndarray,
    batch: list[tuple[int, list[str]]],
    exclude: Sequence[set[tuple[tuple[str, ...], int]]],
    excluded_sentences: set,
) -> None:
    """Score −inf (never returned) each query's excluded ``(sentence tokens, position)`` tokens in this chunk."""
    for idx, s in batch:
        key = tuple(s)
        if key not in excluded_sentences:
            continue
        for qi, pairs in enumerate(exclude):
            for ek, pos in pairs:
                if ek == key:
                    scores[qi, np.nonzero((ref[:, 0] == idx) & (ref[:, 1] == pos))[0]] = -np.inf


def nearest_neighbours(
    embedder,
    queries: np.ndarray,
    corpus: Iterable[Sequence[str]],
    k: int = 5,
    *,
    layer: int | str = "top",
    exclude: Sequence[set[tuple[tuple[str, ...], int]]] | None = None,
    batch_size: int | None = None,
    chunk: int = 256,
) -> list[list[Neighbour]]:
    """The ``k`` corpus tokens whose contextual vectors are nearest (cosine) to each query vector.

    Args:
        embedder: an :class:`~elmokit.Embedder`.
        queries: (Q, 2P) query vectors in the same ``layer`` (e.g. rows of :func:`occurrence_vectors`).
        corpus: token lists, streamed ``chunk`` sentences at a time (only the running top ``k`` is kept).
        layer: an int layer, ``"top"`` or ``"average"`` (as :class:`~elmokit.embedding.pooling.OutputSpec`).
        exclude: per query, ``(tuple(sentence tokens), position)`` pairs never returned (the query's own token
            when the corpus holds the query sentences).

    Returns:
        Per query, up to ``k`` :class:`Neighbour` s, best first (ties: the earlier corpus token).

    Raises:
        UsageError: ``k`` < 1, a bad ``layer``, queries of the wrong width, ``exclude`` of the wrong length.
    """
    unit_queries = _normalise(_check_queries(embedder, queries, k, layer, exclude))
    excluded_sentences = {key for pairs in exclude for key, _ in pairs} if exclude is not None else set()
    top = _RunningTopK(len(unit_queries), k)
    for batch in _sentence_chunks(corpus, chunk):
        scored = _chunk_scores(embedder, unit_queries, batch, batch_size, layer)
        if scored is None:
            continue
        scores, ref = scored
        if exclude is not None:
            _mask_excluded(scores, ref, batch, exclude, excluded_sentences)
        top.add(scores, ref, batch)
    return top.neighbours()


def pca_2d(x: np.ndarray) -> np.ndarray:
    """(N, D) → (N, 2) float64: the centred vectors projected on their first two principal axes (SVD), each axis'
    sign fixed so that its largest-magnitude loading is positive (deterministic). Fewer than 2 axes are zero-filled.

    Raises:
        InputError: ``x`` is not 2-D."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise InputError(f"pca_2d expects (N, D) vectors, got shape {x.shape}")
    out = np.zeros((x.shape[0], 2))
    if x.shape[0] < 2:
        return out
    c = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(c, full_matrices=False)
    vt = vt[:2]
    signs = np.sign(vt[np.arange(len(vt)), np.abs(vt).argmax(axis=1)])
    signs[signs == 0] = 1
    proj = c @ (vt * signs[:, None]).T
    out[:, : proj.shape[1]] = proj
    return out


def plot_scale(vectors: np.ndarray, panels: Sequence[int | str]) -> tuple[list[np.ndarray], float]:
    """The coordinates :func:`plot_occurrences` draws, and the one axis limit every panel shares.

    Each occurrence vector is scaled to unit length before the PCA of its panel, so the picture is cosine geometry:
    two points ``d`` apart in a panel have cosine ≤ 1 − d²/2 (the projection can only shorten distances), whatever the
    layer's norms. The limit is ``max(1, largest |coordinate|)``: occurrences whose cosines all exceed 0.99 stay within
    0.15 of each other on an axis from −1 to 1 instead of filling their own, autoscaled, panel.

    Returns ``([(N, 2) per panel], limit)``."""
    v = np.asarray(vectors, dtype=np.float64)
    coords = []
    for p in panels:
        x = v.mean(axis=1) if p == "average" else v[:, p]
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        coords.append(pca_2d(np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)))
    limit = max([1.0] + [float(np.abs(xy).max()) for xy in coords if xy.size])
    return coords, limit


def _plot_panels(v: np.ndarray, labels: Sequence[object] | None, layers: Sequence[int | str] | None) -> list:
    """The panels to draw (ints and/or ``"average"``), after checking the vectors' rank and the labels' length."""
    if v.ndim != 3:
        raise InputError(f"plot_occurrences expects (N, L+1, D) vectors, got shape {v.shape}")
    n, n_layers = v.shape[0], v.shape[1]
    if labels is not None and len(labels) != n:
        raise InputError(f"plot_occurrences: {len(labels)} labels for {n} occurrences")
    panels = list(range(n_layers)) + ["average"] if layers is None else list(layers)
    for p in panels:
        if p != "average" and not (isinstance(p, int) and 0 <= p < n_layers):
            raise UsageError(f"plot layer {p!r} is not one of 0..{n_layers - 1} or 'average'")
    return panels


def _pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    matplotlib = import_optional("matplotlib", "plots", "the occurrence plot")  # optional: matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt  # optional: matplotlib

    return plt


@dataclass
class _PlotText:
    """How the plot's text is drawn: ``font_path`` (a CJK font, or ``None``), the characters the default font lacks,
    and the note added to the figure's caption when they are romanised."""

    font_path: str | None
    missing: set[str]
    note: str = ""

    @classmethod
    def choose(cls, title: str, names: Sequence[str | None], path: str | Path) -> _PlotText:
        """A CJK font for what the default font cannot draw, or romanisation (logged once) when none is installed."""
        missing = missing_glyphs(title + "".join(str(x) for x in names if x is not None))
        text = cls(cjk_font(missing), missing)
        if missing and text.font_path is None:
            text.note = (
                "; no CJK font on this system: Chinese in pinyin (a CJK font, e.g. Debian's fonts-noto-cjk, draws it)"
            )
            logger.warning(
                "plot %s: no installed font draws %s; the plot romanises it (%s). Install a CJK font (e.g. "
                "Debian/Ubuntu: apt-get install fonts-noto-cjk) to draw the characters",
                path,
                "".join(sorted(missing)),
                romanised(title or "".join(sorted(missing)), missing),
            )
        return text

    def shown(self, text: str) -> str:
        """``text`` as drawn: romanised when it cannot be drawn."""
        return romanised(text, self.missing) if self.missing and self.font_path is None else text

    def font(self, size: float | None = None):
        """The matplotlib ``FontProperties`` of the CJK font, or ``None`` (the default font)."""
        font_manager = import_optional("matplotlib.font_manager", "plots", "the occurrence plot")  # optional
        FontProperties = font_manager.FontProperties

        return FontProperties(fname=self.font_path, size=size) if self.font_path else None


def _label_groups(labels: Sequence[object] | None, n: int) -> tuple[list, dict, np.ndarray]:
    """``(names in drawing order, colour index per name, (G, N) bool membership)``: colours follow the sorted names;
    the largest group is drawn first, so small ones stay visible. Without labels one group, ``None``."""
    if labels is None:
        return [None], {None: 0}, np.ones((1, n), bool)
    names = sorted({str(x) for x in labels}, key=str)
    colour = {name: ci for ci, name in enumerate(names)}
    members = {name: np.array([str(x) == name for x in labels]) for name in names}
    order = sorted(names, key=lambda m: -int(members[m].sum()))
    return order, colour, np.stack([members[name] for name in order])


def _draw_panel(
    ax,
    p: int | str,
    xy: np.ndarray,
    groups: tuple[list, dict, np.ndarray],
    text: _PlotText,
    annotate: bool,
    limit: float,
    cmap,
) -> None:
    """One layer's scatter (coloured by group, points numbered when ``annotate``) on axes from −limit to limit."""
    names, colour, members = groups
    for name, sel in zip(names, members):
        ax.scatter(
            xy[sel, 0],
            xy[sel, 1],
            s=14,
            alpha=0.75,
            color=cmap(colour[name] % 10),
            label=None if name is None else f"{text.shown(name)} ({int(sel.sum())})",
        )
    if annotate:
        for i in range(len(xy)):
            ax.annotate(str(i), xy[i], fontsize=7, alpha=0.8)
    ax.set_title("layer average" if p == "average" else ("layer 0 (static)" if p == 0 else f"layer {p}"))
    ax.set_xlim(-limit, limit)
    ax.set_ylim(-limit, limit)
    ax.set_aspect("equal")
    ax.tick_params(labelsize=7)


def plot_format(path: str | Path) -> str:
    """The format a plot at ``path`` is written in, by its suffix: ``png``, ``svg`` or ``pdf``.

    Raises:
        UsageError: any other suffix (a ``.jpg`` would otherwise hold PNG bytes), naming the path and the three."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_FORMATS:
        raise UsageError(
            f"the plot {path} ends in {suffix or 'no suffix'!r}: a plot is written as .png, .svg or .pdf (by the "
            "suffix asked)"
        )
    return PLOT_FORMATS[suffix]


def is_elmokit_plot(path: str | Path) -> bool:
    """Whether ``path`` is a plot :func:`plot_occurrences` wrote: the signature of a PNG, SVG or PDF file, and
    :data:`PLOT_CREATOR` in its metadata (read from the first and last 64 KiB: a PNG's text chunk and an SVG's
    metadata come first, a PDF's Info dictionary last). Anything unreadable is not one."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
            size = fh.seek(0, 2)
            fh.seek(max(0, size - (1 << 16)))
            tail = fh.read()
    except OSError:
        return False
    start = head.lstrip()
    if not any(start.startswith(sig) for sigs in _PLOT_SIGNATURES.values() for sig in sigs):
        return False
    mark = PLOT_CREATOR.encode("ascii")
    return mark in head or mark in tail


def plot_occurrences(
    vectors: np.ndarray,
    path: str | Path,
    labels: Sequence[object] | None = None,
    *,
    title: str = "",
    layers: Sequence[int | str] | None = None,
    annotate: bool | None = None,
) -> Path:
    """Draw each layer's 2-D PCA projection of the occurrence vectors, one panel per layer, coloured by label, into
    ``path`` (matplotlib Agg; written atomically), as PNG, SVG or PDF by its suffix (:func:`plot_format`), with
    :data:`PLOT_CREATOR` in its metadata (how ``--overwrite`` recognises a plot elmokit wrote).

    Args:
        vectors: (N, L+1, D) from :func:`occurrence_vectors`.
        labels: N labels (colours and legend), or ``None``.
        layers: the panels: ints and/or ``"average"`` (default: every layer and the average). Layer 0 is
            context-free, so every occurrence of a one-token word falls on one point there.
        annotate: write each point's index beside it (default: when N ≤ 40).

    Colours follow the sorted label names; the largest label is drawn first, so a rare sense is not hidden. Every
    panel has the same, stated scale (:func:`plot_scale`: unit-length vectors, axes from −limit to limit), so a layer
    whose occurrences are nearly identical shows one tight blob rather than autoscaled "clusters". Text the default
    font cannot draw (the title, labels: 苹果) is drawn with an installed CJK font (:func:`cjk_font`; e.g. Debian's
    ``fonts-noto-cjk``); without one it is romanised (:func:`romanised`: ``pingguo``), the figure says so and a
    warning is logged.

    Returns the path. Raises :class:`InputError` for vectors of the wrong rank or labels of the wrong length,
    :class:`UsageError` for a layer out of range or a suffix other than ``.png``, ``.svg``, ``.pdf``.
    """
    fmt = plot_format(path)
    v = np.asarray(vectors, dtype=np.float64)
    panels = _plot_panels(v, labels, layers)
    n = v.shape[0]
    plt = _pyplot()
    groups = _label_groups(labels, n)
    text = _PlotText.choose(title, groups[0], path)
    coords, limit = plot_scale(v, panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.6), squeeze=False)
    for ax, p, xy in zip(axes[0], panels, coords):
        _draw_panel(ax, p, xy, groups, text, n <= 40 if annotate is None else annotate, limit, plt.get_cmap("tab10"))
    if labels is not None:
        axes[0][-1].legend(fontsize=8, loc="best", prop=text.font(size=8))
    if title:
        fig.suptitle(text.shown(title), fontproperties=text.font())
    fig.text(
        0.5,
        0.01,
        "PCA of the unit-length vectors per layer, the same scale in every panel: points d apart have "
        f"cosine ≤ 1 − d²/2{text.note}",
        ha="center",
        fontsize=7,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = Path(path)
    with atomic_path(path, suffix=f".{fmt}") as tmp:
        fig.savefig(tmp, format=fmt, dpi=110, metadata={_PLOT_METADATA_KEY[fmt]: PLOT_CREATOR})
    plt.close(fig)
    return path
