"""What goes to TensorBoard and the other loggers, and the figures.

Scalars reach every Lightning logger through ``logger.log_metrics`` (CSV,
MLflow, W&B and TensorBoard alike). A :class:`~lightning.pytorch.loggers.TensorBoardLogger`
also gets the extras, written to its ``SummaryWriter``:

============================================  ==========================================
tag                                           what
============================================  ==========================================
``ig/completeness/worst_relative_error``      scalar: worst completeness error (non-degenerate states)
``ig/completeness/mean_abs_error``            scalar: mean ``|sum(attr) - (F(x) - F(b))|``
``ig/mean_abs/<feature>``                     scalar per feature: mean ``|attr|`` over states
``ig/mean_signed/<feature>``                  scalar per feature: mean ``attr`` over states
``ig/drift/spearman_prev``                    scalar: rank correlation of mean ``|attr|`` with the previous run
``ig/drift/spearman_first``                   scalar: ... with the first run
``ig/drift/topk_jaccard_prev``                scalar: overlap of the top-k features with the previous run
``ig/time_ms``                                scalar: wall time of the IG computation
``ig/attributions/<feature>``                 histogram per feature over states
``ig/top_features``                           image: bar chart of mean ``|attr|`` with spread, coloured by sign
``ig/heatmap``                                image: features x IG runs over training
``ig/report``                                 text: markdown top-k table and completeness
============================================  ==========================================

plus a custom-scalars layout (the "Custom Scalars" tab) that draws all
``ig/mean_abs/*`` lines in one chart, all ``ig/mean_signed/*`` in another, and
the drift and completeness scalars in one chart each.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot
state, nothing left open) and written as RGB images.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_ig.report import rank_order

__all__ = [
    "TAG_PREFIX",
    "feature_tags",
    "scalar_metrics",
    "log_scalars",
    "custom_scalars_layout",
    "report_markdown",
    "top_features_figure",
    "heatmap_figure",
    "figure_to_array",
    "figure_to_png",
    "RenderedFigure",
    "histogram_proto",
    "log_tensorboard_extras",
    "is_tensorboard_logger",
]

TAG_PREFIX = "ig"

# Colours for the sign of the mean attribution (ColorBrewer RdBu ends: readable for most colour-blind viewers).
_POSITIVE = "#2166ac"
_NEGATIVE = "#b2182b"
_HEATMAP_MAX_FEATURES = 40
_DRIFT_LABELS = {
    "spearman_prev": "Spearman rank correlation with the previous run",
    "spearman_first": "with the first run",
    "topk_jaccard_prev": "top-k Jaccard overlap with the previous run",
}


def feature_tags(feature_names: Sequence[str]) -> list[str]:
    """TensorBoard-safe, unique tag suffixes for feature names.

    Characters outside ``[A-Za-z0-9_.-]`` (spaces, ``/`` that would nest tags,
    brackets) become ``_``; a name that collides with an earlier one gets
    ``_<index>`` appended.

    Args:
        feature_names: one name per feature.

    Returns:
        One tag suffix per feature, in order.

    Example::

        >>> feature_tags(["cart position", "pole/angle", "x[0,1]"])
        ['cart_position', 'pole_angle', 'x_0_1_']
    """
    tags: list[str] = []
    seen: set[str] = set()
    for index, name in enumerate(feature_names):
        tag = re.sub(r"[^A-Za-z0-9_.\-]", "_", str(name)) or f"feature_{index}"
        if tag in seen:
            tag = f"{tag}_{index}"
        seen.add(tag)
        tags.append(tag)
    return tags


def scalar_metrics(
    *,
    tags: Sequence[str],
    mean_abs: np.ndarray,
    mean_signed: np.ndarray,
    worst_relative_error: float | None,
    mean_abs_error: float | None,
    drift: Mapping[str, float],
    time_ms: float,
) -> dict[str, float]:
    """The scalars of one IG run, keyed by their tags.

    Args:
        tags: from :func:`feature_tags`.
        mean_abs: ``(F,)`` mean ``|attr|`` per feature.
        mean_signed: ``(F,)`` mean ``attr`` per feature.
        worst_relative_error: the completeness summary's worst relative error (``None`` is logged as NaN).
        mean_abs_error: the mean absolute completeness error.
        drift: ``spearman_prev``, ``spearman_first``, ``topk_jaccard_prev`` (any subset; the first run has none).
        time_ms: wall time of the IG computation.

    Returns:
        ``{tag: value}`` with plain Python floats.
    """
    metrics: dict[str, float] = {
        f"{TAG_PREFIX}/completeness/worst_relative_error": _float(worst_relative_error),
        f"{TAG_PREFIX}/completeness/mean_abs_error": _float(mean_abs_error),
    }
    for tag, value in zip(tags, mean_abs.tolist()):
        metrics[f"{TAG_PREFIX}/mean_abs/{tag}"] = value
    for tag, value in zip(tags, mean_signed.tolist()):
        metrics[f"{TAG_PREFIX}/mean_signed/{tag}"] = value
    for name, value in drift.items():
        metrics[f"{TAG_PREFIX}/drift/{name}"] = _float(value)
    metrics[f"{TAG_PREFIX}/time_ms"] = float(time_ms)
    return metrics


def _float(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def log_scalars(loggers: Sequence[Any], metrics: Mapping[str, float], step: int) -> None:
    """Send scalars to every logger through ``log_metrics`` (call on global rank zero).

    Args:
        loggers: ``trainer.loggers``.
        metrics: from :func:`scalar_metrics`.
        step: the global step to log at.
    """
    for logger in loggers:
        logger.log_metrics(dict(metrics), step=step)


def is_tensorboard_logger(logger: Any) -> bool:
    """Whether ``logger`` is Lightning's ``TensorBoardLogger`` (which gets histograms, figures and text)."""
    try:
        from lightning.pytorch.loggers import TensorBoardLogger  # noqa: PLC0415 - keep the import lazy
    except ImportError:  # pragma: no cover - lightning is a dependency
        return False
    return isinstance(logger, TensorBoardLogger)


def custom_scalars_layout(title: str = "Integrated Gradients") -> dict[str, dict[str, list[Any]]]:
    """The custom-scalars layout that groups the per-feature lines into one chart each.

    Args:
        title: the category name shown in TensorBoard's "Custom Scalars" tab.

    Returns:
        A layout for ``SummaryWriter.add_custom_scalars``: charts of regular
        expressions over the tags (``Multiline`` charts).
    """
    prefix = re.escape(TAG_PREFIX)
    return {
        title: {
            "mean |attribution| per feature": ["Multiline", [rf"{prefix}/mean_abs/.*"]],
            "mean attribution per feature (signed)": ["Multiline", [rf"{prefix}/mean_signed/.*"]],
            "drift between IG runs": ["Multiline", [rf"{prefix}/drift/.*"]],
            "completeness error": ["Multiline", [rf"{prefix}/completeness/.*"]],
        }
    }


def _format(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "n/a"
    value = float(value)
    return "nan" if value != value else format(value, spec)


def report_markdown(report: Mapping[str, Any], drift: Mapping[str, float] | None = None) -> str:
    """A markdown summary of a report: the top-k table, completeness and drift.

    Args:
        report: from :func:`lightning_ig.report.build_report`.
        drift: the run's drift scalars, if any.

    Returns:
        Markdown that TensorBoard's text plugin renders (tables included).
    """
    completeness = report["completeness"]
    step = report.get("global_step")
    head = f"### Integrated Gradients{'' if step is None else f' at step {step}'}\n\n"
    settings = (
        f"{report['num_states']} states, {report['num_steps']} steps ({report.get('method', '?')}, "
        f"{report.get('gradient', '?')} gradients, {report.get('backend', '?')} backend), "
        f"target `{report['forward_target']}`, baseline `{report.get('baseline', '?')}`\n\n"
    )
    rows = ["| rank | feature | mean \\|attr\\| | std | mean attr |", "|---:|:---|---:|---:|---:|"]
    for rank, feature in enumerate(report["top_10_by_mean_abs"], start=1):
        name = str(feature["name"]).replace("|", "\\|")
        rows.append(
            f"| {rank} | {name} | {_format(feature['mean_abs'])} | {_format(feature['stddev'])} "
            f"| {_format(feature['mean_signed'], '+.4g')} |"
        )
    degenerate = completeness.get("num_degenerate", 0)
    regular = report["num_states"] - degenerate
    lines = [
        "",
        "",
        f"**Completeness**: worst relative error {_format(completeness['worst_relative_error'])} over "
        f"{regular} states; mean absolute error {_format(completeness.get('mean_abs_error'))}"
        + (
            f"; {degenerate} degenerate state(s) (|F(x) - F(b)| too small for a ratio) kept apart"
            if degenerate
            else ""
        )
        + ".",
    ]
    if drift:
        parts = [f"{_DRIFT_LABELS.get(name, name)} {_format(value, '.3f')}" for name, value in drift.items()]
        lines += ["", f"**Drift**: {', '.join(parts)}."]
    return head + settings + "\n".join(rows) + "\n".join(lines) + "\n"


def _new_figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # noqa: PLC0415 - matplotlib only when figures are drawn

    return Figure(figsize=(width, height), dpi=100, facecolor="white")


def _label_margin(labels: Sequence[str]) -> float:
    """Inches left of the axes for tick labels of this length (about 0.075 in per character at 9-10 pt)."""
    return 0.5 + 0.075 * max((min(len(label), 28) for label in labels), default=4)


def figure_to_array(figure: Any) -> np.ndarray:
    """Render a matplotlib figure on the Agg canvas and return it as ``(H, W, 3)`` uint8 RGB.

    Args:
        figure: a ``matplotlib.figure.Figure``; it holds no reference to pyplot,
            so it is freed with its last reference (nothing to close).

    Returns:
        The pixels, for ``SummaryWriter.add_image(..., dataformats="HWC")``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())  # (H, W, 4)
    return np.ascontiguousarray(rgba[..., :3])


def top_features_figure(
    feature_names: Sequence[str],
    mean_abs: np.ndarray,
    stddev: np.ndarray,
    mean_signed: np.ndarray,
    *,
    top_k: int = 10,
    step: int | None = None,
    num_states: int | None = None,
) -> Any:
    """Bar chart of the top-k features by mean ``|attr|``, whiskers the spread, colour the sign.

    Args:
        feature_names: one name per feature.
        mean_abs: ``(F,)`` mean ``|attr|`` per feature.
        stddev: ``(F,)`` standard deviation of ``attr`` over states (the whiskers).
        mean_signed: ``(F,)`` mean ``attr``; its sign picks the bar's colour.
        top_k: how many features to draw (default 10).
        step: the global step, for the title.
        num_states: number of states, for the axis label.

    Returns:
        A ``matplotlib.figure.Figure``.
    """
    from matplotlib.patches import Patch  # noqa: PLC0415

    order = rank_order(mean_abs)[:top_k]
    count = len(order)
    figure = _new_figure(8.0, 1.8 + 0.38 * count)
    axes = figure.add_subplot()
    positions = np.arange(count)[::-1]  # largest on top
    values = np.nan_to_num(mean_abs[order])
    colours = [_POSITIVE if mean_signed[i] >= 0 else _NEGATIVE for i in order]
    axes.barh(
        positions,
        values,
        xerr=np.nan_to_num(stddev[order]),
        color=colours,
        edgecolor="none",
        height=0.7,
        error_kw={"ecolor": "#444444", "elinewidth": 1.0, "capsize": 3},
    )
    labels = [str(feature_names[i]) for i in order]
    axes.set_yticks(positions, [label if len(label) <= 28 else label[:27] + "..." for label in labels], fontsize=10)
    axes.set_xlim(left=0.0)
    for position, value in zip(positions, values):
        axes.annotate(
            f"{value:.3g}", (value, position), xytext=(3, 7), textcoords="offset points", fontsize=8, color="#222222"
        )
    states = f" over {num_states} states" if num_states else ""
    axes.set_xlabel(f"mean |attribution|{states}  (whiskers: std of attribution)", fontsize=10)
    title = f"Top {count} features by mean |IG attribution|"
    figure.suptitle(title + ("" if step is None else f"  (step {step})"), fontsize=12, x=0.02, ha="left")
    axes.spines[["top", "right"]].set_visible(False)
    axes.grid(axis="x", color="#dddddd", linewidth=0.8)
    axes.set_axisbelow(True)
    # Above the axes, so it never hides a bar or a whisker.
    axes.legend(
        handles=[
            Patch(color=_POSITIVE, label="mean attribution > 0 (raises the target)"),
            Patch(color=_NEGATIVE, label="mean attribution < 0 (lowers the target)"),
        ],
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=2,
        fontsize=8,
        frameon=False,
        borderaxespad=0.2,
    )
    figure.subplots_adjust(
        left=_label_margin(labels) / figure.get_figwidth(),
        right=0.96,
        top=1 - 0.85 / figure.get_figheight(),
        bottom=0.7 / figure.get_figheight(),
    )
    return figure


def heatmap_figure(
    feature_names: Sequence[str], steps: Sequence[int], mean_abs_history: np.ndarray, *, normalise: bool = True
) -> Any:
    """Heatmap of feature importance (rows) over IG runs (columns).

    Each column is one run's mean ``|attr|`` per feature, divided by the
    column's sum when ``normalise`` (the share of the total, so runs with
    different value scales compare). Rows are ordered by the last run's value;
    with more than 40 features only the 40 largest are shown.

    Args:
        feature_names: one name per feature.
        steps: the global step of each run (column labels).
        mean_abs_history: ``(num_runs, F)`` mean ``|attr|`` per run.
        normalise: divide each run by its total (default ``True``).

    Returns:
        A ``matplotlib.figure.Figure``.
    """
    history = np.asarray(mean_abs_history, dtype=np.float64)  # (R, F)
    runs, features = history.shape
    order = rank_order(history[-1])[:_HEATMAP_MAX_FEATURES]
    values = history[:, order].T  # (F_shown, R): features down, runs across
    if normalise:
        totals = np.nansum(np.abs(history), axis=1)  # (R,)
        values = values / np.where(totals > 0, totals, 1.0)[None, :]
    rows = len(order)
    figure = _new_figure(float(np.clip(5.0 + 0.1 * runs, 7.5, 14.0)), 1.6 + 0.3 * rows)
    axes = figure.add_subplot()
    image = axes.imshow(values, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0.0)
    labels = [str(feature_names[i])[:28] for i in order]
    axes.set_yticks(np.arange(rows), labels, fontsize=9)
    ticks = np.unique(np.linspace(0, runs - 1, num=min(runs, 8)).round().astype(int))
    axes.set_xticks(ticks, [str(steps[i]) for i in ticks], fontsize=8)
    axes.set_xlabel("global step of the IG run", fontsize=10)
    shown = "" if rows == features else f" (top {rows} of {features})"
    axes.set_title(f"Feature importance over training{shown}", fontsize=12, loc="left")
    colourbar = figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02)
    colourbar.set_label("share of the run's mean |attr|" if normalise else "mean |attr|", fontsize=9)
    colourbar.ax.tick_params(labelsize=8)
    figure.subplots_adjust(
        left=_label_margin(labels) / figure.get_figwidth(),
        right=1 - 0.9 / figure.get_figwidth(),
        top=1 - 0.5 / figure.get_figheight(),
        bottom=0.65 / figure.get_figheight(),
    )
    return figure


@dataclass(frozen=True)
class RenderedFigure:
    """A figure already encoded as PNG (see :func:`figure_to_png`)."""

    png: bytes
    height: int
    width: int


def figure_to_png(figure: Any, dpi: int = 100) -> RenderedFigure:
    """Render a matplotlib figure on the Agg canvas straight to PNG bytes.

    Args:
        figure: a ``matplotlib.figure.Figure`` (freed with its last reference: nothing to close).
        dpi: pixels per inch (default 100).

    Returns:
        The PNG and its size in pixels.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415

    FigureCanvasAgg(figure)  # attach the Agg canvas (a pyplot-free figure has none that renders)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    png = buffer.getvalue()
    # The PNG header (IHDR) holds the size: width then height, big-endian, at bytes 16..24.
    return RenderedFigure(png, height=int.from_bytes(png[20:24], "big"), width=int.from_bytes(png[16:20], "big"))


def histogram_proto(values: np.ndarray, bins: int = 30) -> Any:
    """A TensorBoard ``HistogramProto`` of ``values`` with ``bins`` equal-width buckets.

    Fewer buckets than ``SummaryWriter.add_histogram``'s default (hundreds of
    exponential ones) keep this cheap; TensorBoard re-buckets for display anyway.

    Args:
        values: finite numbers, at least one.
        bins: number of buckets (default 30).

    Returns:
        A ``tensorboard.compat.proto.summary_pb2.HistogramProto``.

    Raises:
        ValueError: ``values`` is empty.
    """
    from tensorboard.compat.proto.summary_pb2 import HistogramProto  # noqa: PLC0415

    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError("histogram_proto needs at least one value, got none")
    low, high = float(values.min()), float(values.max())
    if low == high:  # one bucket around a constant
        low, high = low - 0.5, high + 0.5
    counts, edges = np.histogram(values, bins=bins, range=(low, high))
    # TensorBoard stores right edges only; a leading empty bucket carries the left edge.
    return HistogramProto(
        min=float(values.min()),
        max=float(values.max()),
        num=int(values.size),
        sum=float(values.sum()),
        sum_squares=float(values @ values),
        bucket_limit=edges.tolist(),
        bucket=[0, *counts.tolist()],
    )


def log_tensorboard_extras(
    writer: Any,
    *,
    step: int,
    tags: Sequence[str],
    attributions: np.ndarray | None,
    markdown: str | None,
    figures: Mapping[str, Any] | None = None,
    layout: Mapping[str, Any] | None = None,
) -> None:
    """Write histograms, figures, text and (once) the custom-scalars layout to a ``SummaryWriter``.

    Everything of one run goes into one event (one summary with many values),
    so the writer's queue sees one item per run, not one per tag.

    Args:
        writer: ``TensorBoardLogger.experiment`` (a ``SummaryWriter``).
        step: the global step.
        tags: from :func:`feature_tags`.
        attributions: ``(num_states, F)`` for the per-feature histograms, or ``None`` to skip them.
        markdown: the ``ig/report`` text, or ``None`` to skip it.
        figures: ``{"top_features": ..., "heatmap": ...}`` (any subset) to write as images:
            matplotlib figures or :class:`RenderedFigure`.
        layout: a custom-scalars layout to write (pass it on the first run only).
    """
    from tensorboard.compat.proto.summary_pb2 import Summary  # noqa: PLC0415

    if layout is not None:
        writer.add_custom_scalars(dict(layout))
    values: list[Any] = []
    if attributions is not None:
        for index, tag in enumerate(tags):
            column = attributions[:, index]
            finite = column[np.isfinite(column)]
            if finite.size:  # a histogram of nothing is an error in TensorBoard
                values.append(Summary.Value(tag=f"{TAG_PREFIX}/attributions/{tag}", histo=histogram_proto(finite)))
    for name, figure in (figures or {}).items():
        rendered = figure if isinstance(figure, RenderedFigure) else figure_to_png(figure)
        image = Summary.Image(
            height=rendered.height, width=rendered.width, colorspace=4, encoded_image_string=rendered.png
        )
        values.append(Summary.Value(tag=f"{TAG_PREFIX}/{name}", image=image))
    if markdown is not None:
        values.extend(_text_summary(f"{TAG_PREFIX}/report", markdown).value)
    if not values:
        return
    file_writer = getattr(writer, "_get_file_writer", None)  # torch's and tensorboardX's SummaryWriter
    if file_writer is not None:
        file_writer().add_summary(Summary(value=values), step)
        return
    for value in values:  # another writer: one public call per value
        if value.HasField("histo"):
            column = attributions[:, list(tags).index(value.tag.rsplit("/", 1)[1])]  # type: ignore[index]
            writer.add_histogram(value.tag, column[np.isfinite(column)], step)
        elif value.HasField("image"):
            writer.add_image(value.tag, _png_to_array(value.image.encoded_image_string), step, dataformats="HWC")
        else:
            writer.add_text(value.tag, markdown, step)


def _png_to_array(png: bytes) -> np.ndarray:
    from matplotlib.image import imread  # noqa: PLC0415

    pixels = imread(io.BytesIO(png), format="png")  # (H, W, 4) floats in [0, 1]
    return (pixels[..., :3] * 255).round().astype(np.uint8)


def _text_summary(tag: str, text: str) -> Any:
    """A text-plugin summary under exactly ``tag`` (``SummaryWriter.add_text`` appends ``/text_summary``)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata  # noqa: PLC0415
    from tensorboard.compat.proto.tensor_pb2 import TensorProto  # noqa: PLC0415
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto  # noqa: PLC0415
    from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData  # noqa: PLC0415

    content = TextPluginData(version=0).SerializeToString()
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text", content=content))
    tensor = TensorProto(
        dtype="DT_STRING",
        string_val=[text.encode("utf-8")],
        tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
    )
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])
