"""``lightning-ig show``: a report as a table, and the words for its completeness that ``diag`` prints too.

A report is read tolerantly: a missing or odd part (``"completeness": null``, a feature without numbers) is said in
the table, not fatal; only a file that is not a JSON object of schema version 1 is refused (status 2, one line).
Every string from the file is printed through :func:`~lightning_ig.cli.terminal.printable`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from typing import Any

from lightning_ig.cli.exits import EXIT_OK, UsageError, read_json_file
from lightning_ig.cli.terminal import printable
from lightning_ig.cli.verify import accuracy_words, verify_lines
from lightning_ig.views.text import format_percent
from lightning_ig.vocabulary import relative_error_text

__all__ = ["completeness_words", "format_report", "run_show"]


def run_show(args: argparse.Namespace) -> int:
    """Print every report named on the command line."""
    texts = [format_report(_read_report(path), path, args.top, args.worst_states) for path in args.reports]
    try:
        print("\n\n".join(texts), flush=True)
    except BrokenPipeError:
        raise
    except OSError as error:  # a full disk behind stdout: the printing is show's work
        raise UsageError(f"cannot print to stdout ({error.strerror or error})") from None
    return EXIT_OK


def _read_report(path: str) -> dict[str, Any]:
    report = read_json_file(path, "report", "give a JSON file written by lightning-ig diag")
    if not isinstance(report, dict):
        raise UsageError(
            f"{path!r} holds a JSON {type(report).__name__}, not a lightning-ig report; give a file written by "
            "lightning-ig diag"
        )
    if "schema_version" not in report:
        raise UsageError(
            f"{path!r} is not a lightning-ig report (no schema_version); give a file written by lightning-ig diag"
        )
    if type(version := report["schema_version"]) is not int or version != 1:  # true == 1 in Python, not in a schema
        raise UsageError(f"{path!r} has schema_version {version!r:.40}; this lightning-ig reads version 1")
    return report


# ---------------------------------------------------------- tolerant access: a part of the wrong type reads as missing


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _records(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _real(value: Any) -> float | None:
    """A finite number, or ``None`` (missing, null, text, bool, an integer too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _text(value: Any, width: int | None = None) -> str:
    """``value`` cut to ``width`` characters, then as printable text (control characters escaped)."""
    text = "-" if value is None else " ".join(str(value).split())
    return printable(text if width is None else text[:width])  # cut, then escaped: never half an escape


def _number(value: Any, width: int = 11) -> str:
    """``value`` in ``width`` characters (``0``: as wide as it needs), or ``n/a``."""
    real = _real(value)
    if width == 0:
        return "n/a" if real is None else f"{real:.4g}"
    return "n/a".rjust(width) if real is None else f"{real:{width}.4g}"


def completeness_words(report: Mapping[str, Any], ratio: bool = True) -> str | None:
    """How far the report's attributions can be trusted, in one phrase.

    NaN/Inf outputs come first (``non_finite_states``), then "no state could be checked" when every state was
    degenerate, else the worst relative completeness error (not judged beside a verdict; ``None`` without ``ratio``).
    """
    completeness, num_states = _mapping(report.get("completeness")), _real(report.get("num_states"))
    if isinstance(non_finite := report.get("non_finite_states"), list) and non_finite:
        of = f" of {num_states:.0f}" if num_states is not None else ""
        return f"NaN/Inf on {len(non_finite)}{of} states (first: state {_text(non_finite[0])})"
    worst = _real(completeness.get("worst_relative_error"))
    degenerate = _real(completeness.get("num_degenerate")) or 0
    if num_states is not None and degenerate >= num_states > 0:  # whatever number a report holds as the worst
        return f"no state could be checked ({degenerate:.0f} degenerate: |F(x) - F(b)| too small for a ratio)"
    if not ratio:  # said by the accuracy verdict, whose figures are well conditioned
        return None
    if worst is None:
        return "worst relative error n/a"
    unchecked = f" ({degenerate:.0f} degenerate state(s) not checked)" if degenerate else ""
    verdict = isinstance(completeness.get("verdict"), dict)  # beside a verdict, whose figures are well conditioned
    note = " (|delta| / |dF|: large where dF is small; the verdict reads the figures above)" if verdict else ""
    return f"worst relative error {relative_error_text(worst)}{unchecked}{note}"


def format_report(report: Mapping[str, Any], path: str, top: int, worst_states: int) -> str:
    """The table ``show`` prints for one report."""
    lines = [printable(path), _header(report), ""]
    lines += _feature_lines(report, top)
    lines += _group_lines(report, top)
    error = _real(_mapping(report.get("completeness")).get("mean_abs_error"))
    mean = "" if error is None else f", mean |delta| {error:.3g}"
    accuracy = accuracy_words(report)  # reports written before the verdict have none
    lines += ["", *([] if accuracy is None else ["  " + printable(accuracy)])]
    lines += [f"  completeness: {completeness_words(report)}{mean}", *_trust_lines(report)]
    if report.get("stochastic_forward") is True:
        lines.append(
            "  warning: the forward gave different values for the same state; these attributions are not reproducible"
        )
    lines += _worst_state_lines(report, worst_states)
    return "\n".join(lines + _verify_lines(report.get("verify")) + _action_lines(report, top))


def _trust_lines(report: Mapping[str, Any]) -> list[str]:
    """A callback's report: its trust status and the reason of each failed check (diag's reports have none)."""
    trust = _mapping(report.get("trust"))
    listed = trust.get("reasons")
    reasons = [f"    - {_text(why)}" for why in listed if isinstance(why, str)] if isinstance(listed, list) else []
    return [] if trust.get("status") is None else [f"  trust checks: {_text(trust['status'])}", *reasons]


def _verify_lines(key: Any) -> list[str]:
    """``diag --verify``'s lines, as diag printed them; one line for a key that does not read as one."""
    try:
        return ["", *("  " + printable(line) for line in verify_lines(key))] if key is not None else []
    except (KeyError, TypeError, ValueError, AttributeError):
        return ["", "  verify: in the report, but not in the form diag writes"]


def _action_lines(report: Mapping[str, Any], top: int) -> list[str]:
    """A ``--target each`` report's actions: each one's top features and its own accuracy verdict."""
    lines = []
    for action in _records(report.get("actions")):
        ranked = _records(action.get("top_10_by_mean_abs"))[: max(top, 0)]
        features = ", ".join(f"{_text(unit.get('name'), 24)} {_number(unit.get('mean_abs'), 0)}" for unit in ranked)
        name = f" ({_text(action['name'], 24)})" if action.get("name") is not None else ""
        lines += [f"  action {_text(action.get('action'))}{name}: {features or 'no features listed'}"]
        lines += [f"    {printable(words)}" for words in [accuracy_words(action)] if words is not None]
    return ["", "  per action (mean |attribution|)", *lines] if lines else []


def _header(report: Mapping[str, Any]) -> str:
    method = f"   method {_text(report['method'])}" if "method" in report else ""
    head = "" if report.get("regime_head") is None else f"   head {_text(report['regime_head'])}"  # merged files only
    step = "" if report.get("global_step") is None else f"   step {_text(report['global_step'])}"  # a callback's
    return (
        f"  checkpoint {_text(report.get('checkpoint'))}{head}{step}   "
        f"target {_text(report.get('forward_target'))}   steps {_text(report.get('num_steps'))}   "
        f"states {_text(report.get('num_states'))}   features {_text(report.get('state_dim'))}{method}"
    )


def _feature_lines(report: Mapping[str, Any], top: int) -> list[str]:
    if not (features := _records(report.get("features"))):
        return ["  features: not in the report"]
    ranked = _records(report.get("top_10_by_mean_abs"))
    if top > len(ranked):  # the report lists top_k; rank the full list when more are asked for
        ranked = sorted(features, key=lambda feature: -(_real(feature.get("mean_abs")) or -math.inf))
    lines = [
        "  top features by mean |attribution|",
        f"  {'rank':>4}  {'feature':<24} {'mean_abs':>11} {'stddev':>11} {'mean_signed':>11}",
    ]
    for rank, feature in enumerate(ranked[:top], start=1):
        lines.append(
            f"  {rank:>4}  {_text(feature.get('name'), 24):<24} {_number(feature.get('mean_abs'))} "
            f"{_number(feature.get('stddev'))} {_number(feature.get('mean_signed'))}"
        )
    return lines


def _group_lines(report: Mapping[str, Any], top: int) -> list[str]:
    """The groups (``--feature-groups``, or the callback's), largest mean |attribution| first; none without groups."""
    if not (groups := _records(report.get("groups"))):
        return []
    key = "share" if any(_real(group.get("share")) is not None for group in groups) else "mean_abs"  # older: none
    ranked = sorted(groups, key=lambda group: (_real(group.get(key)) is None, -(_real(group.get(key)) or 0.0)))
    by = "share of |attribution| (as the verdict card)" if key == "share" else "mean |attribution|"
    lines = [
        "",
        f"  groups by {by} ({len(groups)} groups; mean_abs etc.: of the group's attribution, the sum of its members')",
        f"  {'rank':>4}  {'group':<24} {'members':>8} {'share':>7} {'mean_abs':>11} {'stddev':>11} {'mean_signed':>11}",
    ]
    for rank, group in enumerate(ranked[:top], start=1):
        share = "n/a" if (part := _real(group.get("share"))) is None else format_percent(part, 2)  # as the card
        lines.append(
            f"  {rank:>4}  {_text(group.get('name'), 24):<24} {_text(group.get('members')):>8} {share:>7} "
            f"{_number(group.get('mean_abs'))} {_number(group.get('stddev'))} {_number(group.get('mean_signed'))}"
        )
    return lines


def _worst_state_lines(report: Mapping[str, Any], count: int) -> list[str]:
    """The worst states by the estimated attribution error, the figure the verdict reads, near-baseline states (not
    scored) last; by ``|delta| / |dF|`` in reports written before the estimate."""
    if not isinstance(completeness := report.get("completeness"), dict):
        return ["  (the report holds no completeness figures)"]
    rows = _records(completeness.get("per_state"))
    estimated = any(_real(row.get("attribution_error")) is not None for row in rows)
    figures = ("attribution_error", "mass_relative_error", "relative_error") if estimated else ("relative_error",)
    rated = [state for state in rows if _real(state.get(figures[0])) is not None]
    rated.sort(key=lambda state: (state.get("near_baseline") is True, -_real(state[figures[0]])))  # type: ignore[operator]
    if count <= 0:
        return []
    if not rated:  # every state at the baseline or NaN/Inf has no relative error to rank
        return [f"  (the report holds {'no per-state figures' if not rows else 'no state with a relative error'})"]
    names = {"attribution_error": "est.error", "mass_relative_error": "mass-rel.", "relative_error": "rel.error"}
    header = f"  {'state':>6} {'sum(attr)':>11} {'F(x)-F(b)':>11}" + "".join(f" {names[f]:>11}" for f in figures)
    return [*(["", "  worst states by estimated attribution error"] if estimated else []), header] + [
        f"  {_text(state.get('state_idx'), 6):>6} {_number(state.get('sum_attributions'))} "
        f"{_number(state.get('f_input_minus_f_baseline'))}" + "".join(f" {_number(state.get(f))}" for f in figures)
        for state in rated[:count]
    ]
