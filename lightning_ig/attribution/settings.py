"""The engine's options, :class:`IGOptions`: one frozen dataclass, each field checked once when it is made.

The engine's keyword options (:func:`~lightning_ig.attribution.integrated_gradients`,
:class:`~lightning_ig.attribution.IntegratedGradients`) and the callback's ``engine=`` are this class. Names and
checks shared with the callback and the command line come from :mod:`lightning_ig.vocabulary`; the quadrature's
limits from :mod:`lightning_ig.attribution.quadrature`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from lightning_ig.attribution.quadrature import check_rule
from lightning_ig.ops.ig import IGOps, check_backend
from lightning_ig.vocabulary import (
    AUTO_METHOD,
    BUDGET,
    GRADIENTS,
    KINK_METHOD,
    REFINED_METHODS,
    BackendName,
    NSteps,
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

__all__ = ["BUDGET", "DEFAULT_MAX_STEPS", "DEFAULT_METHOD", "DEFAULT_N_STEPS", "IGOptions", "options_with"]

DEFAULT_MAX_STEPS = 512
DEFAULT_N_STEPS: NSteps = BUDGET
"""The default number of points: on ReLU networks every fixed rule is first order, so points are what buy accuracy;
the engine spends what the device has to spare (:mod:`lightning_ig.attribution.budget`). The number used is the
result's ``n_steps`` (``docs/trust.md``)."""
DEFAULT_METHOD = AUTO_METHOD
"""The default rule, ``"auto"``: the kink rule (``"kink_midpoint"``, :mod:`lightning_ig.attribution.kinks`) where
``n_steps`` comes to 128 points or fewer and gradients are autograd's, else the uniform midpoint rule
(``"riemann_middle"``); the result's ``method`` says which ran (:mod:`lightning_ig.attribution.budget`)."""


@dataclass(frozen=True)
class IGOptions:
    """How the engine attributes: every keyword option of :func:`~lightning_ig.attribution.integrated_gradients`
    but ``target``, and ``cuda_graph``; checked when made, read-only afterwards (``dataclasses.replace`` makes a
    changed copy, checked again).

    Args:
        n_steps, method, gradient, backend, internal_batch_size, completeness_tol, max_steps, fd_step, check_finite:
            the keyword options of :func:`~lightning_ig.attribution.integrated_gradients`, with the same defaults
            and meanings (documented there).
        cuda_graph: ``"auto"`` (default: capture and replay a CUDA graph on CUDA devices), ``True`` or ``False``;
            :class:`~lightning_ig.attribution.IntegratedGradients` only (one eager call never captures).

    Raises:
        TypeError: a value of the wrong kind (the message names the option).
        ValueError: a value out of range, or ``n_steps`` (``max_steps`` for ``"auto"``) past what the rule is built for.

    Example::

        options = IGOptions(n_steps=64, method="gausslegendre")
        IntegratedGradientsCallback(states, engine=options)
        dataclasses.replace(options, n_steps=128)  # a changed copy, checked again
    """

    n_steps: NSteps = DEFAULT_N_STEPS
    method: str = DEFAULT_METHOD
    gradient: Literal["autograd", "finite_difference"] = "autograd"
    backend: BackendName | IGOps = "auto"
    internal_batch_size: int | None = None
    completeness_tol: float = 0.01
    max_steps: int = DEFAULT_MAX_STEPS
    fd_step: float | None = None
    check_finite: bool = True
    cuda_graph: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        checked = object.__setattr__  # each field as checked, in its one spelling
        checked(self, "n_steps", check_n_steps(self.n_steps))
        checked(self, "method", check_method(self.method))
        checked(self, "max_steps", check_positive_int(self.max_steps, "max_steps", example=DEFAULT_MAX_STEPS))
        checked(self, "gradient", check_choice(self.gradient, GRADIENTS, "gradient"))
        _check_rule(self.method, self.n_steps, self.gradient)
        checked(self, "backend", check_backend(self.backend))
        checked(
            self, "internal_batch_size", check_optional_positive_int(self.internal_batch_size, "internal_batch_size")
        )
        checked(self, "completeness_tol", check_positive_float(self.completeness_tol, "completeness_tol"))
        checked(
            self, "fd_step", None if self.fd_step is None else check_real(self.fd_step, "fd_step", above=0, below=1)
        )
        checked(self, "check_finite", check_bool(self.check_finite, "check_finite"))
        checked(self, "cuda_graph", _check_cuda_graph(self.cuda_graph))

    def keywords(self) -> dict[str, Any]:
        """The options as :class:`~lightning_ig.attribution.IntegratedGradients` takes them as keywords."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


_NAMES = tuple(field.name for field in dataclasses.fields(IGOptions))


def options_with(options: IGOptions, keywords: Mapping[str, Any]) -> IGOptions:
    """``options`` with ``keywords`` (the engine's keyword options) replacing its fields, checked.

    Raises:
        TypeError: an unknown option, or a value of the wrong kind.
        ValueError: a value out of range.
    """
    if unknown := sorted(set(keywords) - set(_NAMES)):
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; the engine takes target, {', '.join(_NAMES)}")
    return dataclasses.replace(options, **keywords) if keywords else options


def _check_rule(method: str, n_steps: int | str, gradient: str) -> None:
    if method == KINK_METHOD and gradient != "autograd":
        raise ValueError(
            f"method={KINK_METHOD!r} checks its corrections against forward values at exact gradients' kinks, which "
            f"finite differences smear; with gradient={gradient!r} pass method='auto' (the midpoint rule) or another"
        )
    if isinstance(n_steps, int) or n_steps == BUDGET:
        check_rule(method, n_steps if isinstance(n_steps, int) else 64)  # trapezoid needs 2; GL has a largest n
    elif method not in REFINED_METHODS:  # "auto" triples the midpoint nodes (3n hold the n before): no other rule
        raise ValueError(
            f"n_steps='auto' refines by tripling the midpoint nodes; got method={method!r}: pass method='auto' "
            f"(the default), 'kink_midpoint' or 'riemann_middle' with n_steps='auto', or a number of steps"
        )


def _check_cuda_graph(value: Any) -> bool | str:
    if isinstance(value, bool) or (isinstance(value, str) and value == "auto"):
        return value
    error = ValueError if isinstance(value, str) else TypeError
    raise error(f"cuda_graph must be True, False or 'auto', got {shown(value)}")
