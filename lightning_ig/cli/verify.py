"""``diag --verify N`` and the accuracy verdict in diag's words.

``--verify N`` attributes the first ``N`` states again against a high-resolution reference
(:func:`lightning_ig.attribution.exact_line.reference`) and puts each state's *true* error
``||a - a_ref||_1 / ||a_ref||_1`` beside the run's estimate, in the report's ``verify`` key and on stdout; the worst is
over the states away from the baseline, as for the estimate's worst.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lightning_ig.vocabulary import relative_error_text

__all__ = ["accuracy_words", "verify_key", "verify_lines"]


def accuracy_words(report: Mapping[str, Any]) -> str | None:
    """The verdict of a report in one phrase, or ``None`` when the report has no verdict (an older report)."""
    completeness = report.get("completeness")
    if not isinstance(completeness, Mapping) or not isinstance(verdict := completeness.get("verdict"), Mapping):
        return None
    tol, near = verdict.get("tolerance"), completeness.get("num_near_baseline") or 0
    flagged = f"; {near} near-baseline state(s) flagged, not scored" if near else ""
    estimate = _text(completeness.get("worst_attribution_error"))
    mass = _text(completeness.get("worst_mass_relative_error"))
    figures = f"worst estimated attribution error {estimate}, mass-relative {mass}"
    if not isinstance(within := verdict.get("within"), bool):  # null, or a hand-edited "no": never read as within
        return f"accuracy: nothing could be checked ({verdict.get('reason')})"
    tol_text = f"{tol:g}" if isinstance(tol, (int, float)) and not isinstance(tol, bool) else repr(tol)
    if within:  # the bar too: a figure a little above tol passes, as the verdict is judged at sqrt(2) x tol
        bar = _text(verdict.get("threshold"))
        return f"accuracy: within tol {tol_text} ({figures}, both <= sqrt(2) x tol = {bar}{flagged})"
    return f"accuracy: NOT within tol {tol_text} ({figures}{flagged}): {verdict.get('reason')}"


def _text(value: Any) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "n/a"
    return relative_error_text(float(value))


def verify_key(model: Any, states: Any, target: Any, result: Any, count: int) -> dict[str, Any]:
    """The report's ``verify`` key: the first ``count`` states against the reference.

    Args:
        model: the module the run attributed (noise off, eval mode).
        states: ``(B, *feature_shape)`` the run's states.
        target: the run's target (``None``, ``"mean"``, an int or ``"contrast"``).
        result: the run's :class:`~lightning_ig.attribution.IGResult` (one attribution per state).
        count: how many states to verify (at most ``B``).

    Returns:
        ``reference`` (``"exact_line"`` or ``"midpoint:8192"``), ``num_states``, ``seconds``, ``gradients``,
        ``worst_true_error``, ``worst_attribution_error`` (the estimate's worst over the same ordinary states),
        ``batch_true_error`` (``sum|A - A_ref| / sum|A_ref|``), ``num_near_baseline`` and ``per_state``
        (``state_idx``, ``true_error``, ``attribution_error``, ``ratio`` estimate / truth, ``near_baseline``,
        ``regions`` for the exact line); ``None`` for a figure that is not finite.
    """
    import torch  # noqa: PLC0415 - diag's heavy steps import torch when they run

    from lightning_ig.attribution.exact_line import reference  # noqa: PLC0415
    from lightning_ig.attribution.result import NEAR_BASELINE_FRACTION  # noqa: PLC0415

    count = min(count, states.shape[0])
    xs = states[:count].detach()
    bs = result.baselines[:count].detach()  # exactly the baselines the run used (zeros, the states' mean, ...)
    pairs = None if result.target_actions is None else result.target_actions[:count]
    try:
        truth = reference(model, xs, bs, target=target, pairs=pairs)
    except (RuntimeError, NotImplementedError) as failed:  # .detach() or heaviside in the forward; out of memory
        raise ValueError(f"--verify's float64 autograd reference fails on the model: {failed}; drop --verify") from None
    ours = result.attributions[:count].detach().to("cpu", torch.float64).reshape(count, -1)
    ref = truth.attributions.reshape(count, -1)
    mass = ref.abs().sum(1)
    true_error = (ours - ref).abs().sum(1) / mass.clamp_min(torch.finfo(torch.float64).tiny)
    near = (mass < NEAR_BASELINE_FRACTION * mass.median()) | (mass == 0)
    estimate = result.attribution_error[:count].detach().to("cpu", torch.float64)
    ordinary = ~near
    regions = None if truth.regions is None else truth.regions.tolist()
    rows = []
    for i in range(count):
        error, guess = float(true_error[i]), float(estimate[i])
        ratio = guess / error if error > 0 and math.isfinite(guess) else math.nan
        row: dict[str, Any] = {
            "state_idx": i,
            "true_error": _finite(error),
            "attribution_error": _finite(guess),
            "ratio": _finite(ratio),
            "near_baseline": bool(near[i]),
        }
        if regions is not None:
            row["regions"] = int(regions[i])
        rows.append(row)
    scored = ordinary.any()
    return {
        "reference": truth.method,
        "num_states": count,
        "seconds": truth.seconds,
        "gradients": truth.gradients,
        "worst_true_error": _finite(float(true_error[ordinary].max())) if scored else None,
        "worst_attribution_error": _finite(float(estimate[ordinary].max())) if scored else None,
        "batch_true_error": _finite(float((ours - ref).abs().sum() / ref.abs().sum())),
        "num_near_baseline": int(near.sum()),
        "per_state": rows,
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def verify_lines(key: Mapping[str, Any], label: str = "") -> list[str]:
    """What ``--verify`` prints: one line per state, then the worst and the batch figures."""
    cost = f"({key['gradients']} gradients, {key['seconds']:.1f} s)"
    lines = [f"verify{label}: {key['num_states']} states against {key['reference']} {cost}"]
    for row in key["per_state"]:
        flag = "  (near the baseline: not scored)" if row["near_baseline"] else ""
        r = row["ratio"]
        ratio = "n/a" if r is None else f"{r:.2f}x" if r >= 0.01 else f"{r:.1g}x"  # 0.002x, never "0.00x"
        lines.append(
            f"  state {row['state_idx']}: true error {_text(row['true_error'])}, estimate "
            f"{_text(row['attribution_error'])} ({ratio} the truth){flag}"
        )
    lines.append(
        f"  worst true error {_text(key['worst_true_error'])} (estimate's worst {_text(key['worst_attribution_error'])}"
        f"), batch error {_text(key['batch_true_error'])}, {key['num_near_baseline']} near the baseline"
    )
    return lines
