"""The engine's keyword options, checked once where they come in (:func:`parse_settings`).

Names and checks shared with the callback and the command line come from
:mod:`lightning_ig.vocabulary`; the quadrature's limits from
:mod:`lightning_ig.attribution.quadrature`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_ig.attribution.quadrature import check_rule
from lightning_ig.attribution.targets import Target
from lightning_ig.ops.ig import IGOps, check_backend
from lightning_ig.vocabulary import (
    BUDGET,
    GRADIENTS,
    check_bool,
    check_choice,
    check_method,
    check_n_steps,
    check_optional_positive_int,
    check_positive_float,
    check_positive_int,
    check_real,
    shown,
)

__all__ = [
    "BUDGET",
    "DEFAULTS",
    "DEFAULT_MAX_STEPS",
    "DEFAULT_METHOD",
    "DEFAULT_N_STEPS",
    "Settings",
    "parse_settings",
]

DEFAULT_MAX_STEPS = 512
DEFAULT_N_STEPS = BUDGET
"""The default number of points: on ReLU networks every fixed rule is first order, so points are what buy accuracy;
the engine spends what the device has to spare: 256 midpoint nodes where the work is small for the device, 64 where
it is not (:mod:`lightning_ig.attribution.budget`). The number used is the result's ``n_steps`` (``docs/trust.md``)."""
DEFAULT_METHOD = "riemann_middle"
"""The default rule: the uniform midpoint rule (Captum's name). Gauss-Legendre's high order buys nothing where the
integrand is a step function (a ReLU network along the path); the midpoint rule's cells are as even as can be."""


@dataclass(frozen=True)
class Settings:
    """Every option of one attribution, checked (see :func:`lightning_ig.attribution.integrated_gradients`)."""

    target: Target
    n_steps: int | str
    method: str
    gradient: str
    internal_batch_size: int | None
    backend: str | IGOps
    completeness_tol: float
    max_steps: int
    fd_step: float | None
    check_finite: bool
    cuda_graph: bool | str
    error_scale: float = 1.0


DEFAULTS: dict[str, Any] = {
    "target": None,
    "n_steps": DEFAULT_N_STEPS,
    "method": DEFAULT_METHOD,
    "gradient": "autograd",
    "internal_batch_size": None,
    "backend": "auto",
    "completeness_tol": 0.01,
    "max_steps": DEFAULT_MAX_STEPS,
    "fd_step": None,
    "check_finite": True,
    "cuda_graph": "auto",
    "error_scale": 1.0,
}


def parse_settings(options: dict[str, Any]) -> Settings:
    """The :class:`Settings` of ``options`` (missing ones take :data:`DEFAULTS`).

    The target is checked here (:meth:`~lightning_ig.attribution.targets.Target.parse`), per-state indices against
    the batch where it is known (:meth:`~lightning_ig.attribution.targets.Target.on`).

    Raises:
        TypeError: an unknown option, or a value of the wrong kind.
        ValueError: a value out of range; ``n_steps`` (or ``max_steps`` for
            ``"auto"``) past what the quadrature rule is built for.
    """
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; the engine takes {', '.join(DEFAULTS)}")
    merged = {**DEFAULTS, **options}
    n_steps = check_n_steps(merged["n_steps"])
    method = check_method(merged["method"])
    max_steps = check_positive_int(merged["max_steps"], "max_steps", example=DEFAULT_MAX_STEPS)
    _check_rule_size(method, n_steps, max_steps)
    return Settings(
        target=Target.parse(merged["target"]),
        n_steps=n_steps,
        method=method,
        gradient=check_choice(merged["gradient"], GRADIENTS, "gradient"),
        internal_batch_size=check_optional_positive_int(merged["internal_batch_size"], "internal_batch_size"),
        backend=check_backend(merged["backend"]),
        completeness_tol=check_positive_float(merged["completeness_tol"], "completeness_tol"),
        max_steps=max_steps,
        fd_step=_check_fd_step(merged["fd_step"]),
        check_finite=check_bool(merged["check_finite"], "check_finite"),
        cuda_graph=_check_cuda_graph(merged["cuda_graph"]),
        error_scale=check_positive_float(merged["error_scale"], "error_scale"),
    )


def _check_rule_size(method: str, n_steps: int | str, max_steps: int) -> None:
    if isinstance(n_steps, int) or n_steps == BUDGET:
        check_rule(method, n_steps if isinstance(n_steps, int) else 64)  # trapezoid needs 2; GL has a largest n
    elif method != DEFAULT_METHOD:
        # "auto" triples the uniform midpoint rule (3n nodes hold the n before): no other rule nests so, and the
        # error estimate stays calibrated only under refinement that treats every cell alike.
        raise ValueError(
            f"n_steps='auto' refines the uniform midpoint rule (method={DEFAULT_METHOD!r}) by tripling it per state; "
            f"got method={method!r}: pass method={DEFAULT_METHOD!r} with n_steps='auto', or a number of steps"
        )


def _check_fd_step(value: Any) -> float | None:
    """``None`` (automatic) or a relative step in ``(0, 1)``."""
    return None if value is None else check_real(value, "fd_step", above=0, below=1)


def _check_cuda_graph(value: Any) -> bool | str:
    if isinstance(value, bool) or (isinstance(value, str) and value == "auto"):
        return value
    error = ValueError if isinstance(value, str) else TypeError
    raise error(f"cuda_graph must be True, False or 'auto', got {shown(value)}")
