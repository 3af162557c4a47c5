"""What to attribute: target specs, the selection of target values from a forward's output, and target_forward.

A forward maps ``(N, *feature_shape)`` to one value per row ``(N,)``, or to
``(N, A)`` (Q-values, say) with a *target* choosing what to attribute:
``None`` (the forward's own ``(N,)``), ``"mean"`` (the mean over ``A``:
``V(s)`` of a dueling network whose advantages are mean-centred), an int (one
column), a LongTensor ``(B,)`` (one column per state), ``"each"`` (every
column), ``"contrast"`` (per state, the greedy column minus the runner-up's:
"why this action rather than the next best") or a callable ``(N, A) -> (N,)``.
The engine runs the forward on rows laid out ``(*, B)``: row ``r`` belongs to
state ``r % B``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_ig.vocabulary import callable_name

__all__ = [
    "Target",
    "TargetSpec",
    "check_rows_in_range",
    "choose_contrast",
    "select",
    "target_forward",
    "target_label",
    "target_spec",
]

Target = None | str | int | Tensor | Callable[[Tensor], Tensor]

_TARGET_FORMS = "None, 'mean', 'each', 'contrast', an int, a LongTensor of shape (B,) or a callable"


def target_label(target: Any) -> str:
    """What was attributed, in the one form the result, the report, the callback and the command line all use.

    ``None`` -> ``"output"`` (the forward returns one value per row); ``"mean"``;
    ``"each"``; ``"contrast"``; an int ``k`` -> ``"action:k"``; a tensor of one index per state ->
    ``"per_row"``; a callable -> ``"callable:<name>"``.
    """
    if target is None:
        return "output"
    if isinstance(target, str):
        return target
    if isinstance(target, Tensor):
        return f"action:{int(target)}" if target.dim() == 0 else "per_row"
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
        return f"action:{int(target)}"
    if isinstance(target, Callable):  # type: ignore[arg-type]
        return f"callable:{callable_name(target)}"
    raise TypeError(
        f"target must be None, 'mean', 'each', an int, a LongTensor or a callable, got {type(target).__name__}"
    )


@dataclass(frozen=True)
class TargetSpec:
    """A checked target: ``kind`` is one of ``output, mean, action, per_row, each, contrast, callable``.

    ``contrast_fixed`` is a contrast whose pairs were chosen already (a sub-batch of ``n_steps="auto"``).
    """

    kind: str
    label: str  # vocabulary.target_label of the target
    index: int | None = None  # the column for "action"
    rows: Tensor | None = None  # (B,) int64 for "per_row"; (B, 2) greedy, runner-up for "contrast", filled by the run
    rows_max: int = 0  # the largest index in rows, checked against the forward's A on the host
    fn: Callable[[Tensor], Tensor] | None = None  # for "callable"

    def key(self) -> tuple[Any, ...]:
        """What a captured graph depends on: per-row indices are copied in, not part of the key."""
        if self.kind == "per_row":
            return ("per_row", tuple(self.rows.shape) if self.rows is not None else ())
        if self.kind == "callable":
            return ("callable", id(self.fn))
        return (self.kind, self.index)


def target_spec(target: Target, batch: int, device: torch.device) -> TargetSpec:
    """Check ``target`` for ``batch`` states on ``device`` and describe it.

    Raises:
        TypeError: a bool, a float or bool tensor, or an unsupported type.
        ValueError: an unknown name, a negative index, or a tensor of the wrong shape.
    """
    if target is None:
        return TargetSpec("output", target_label(None))
    if isinstance(target, str):
        if target in ("mean", "each", "contrast"):
            return TargetSpec(target, target_label(target))
        raise ValueError(
            f"target must be {_TARGET_FORMS}, got {target!r}; use 'mean' for V(s) of a dueling network or an int for "
            "one action"
        )
    if isinstance(target, bool):
        raise TypeError(f"target must be an int action index, not a bool ({target!r})")
    if isinstance(target, (int, np.integer)):
        if target < 0:
            raise ValueError(f"target must be a non-negative action index, got {target}")
        return TargetSpec("action", target_label(target), index=int(target))
    if isinstance(target, Tensor):
        return _tensor_spec(target, batch, device)
    if callable(target):
        return TargetSpec("callable", target_label(target), fn=target)
    raise TypeError(f"target must be {_TARGET_FORMS}, got {type(target).__name__}")


def _tensor_spec(target: Tensor, batch: int, device: torch.device) -> TargetSpec:
    if target.dtype.is_floating_point or target.dtype == torch.bool or target.dtype.is_complex:
        raise TypeError(f"a target tensor must hold integer action indices, got dtype {target.dtype}")
    if target.dim() == 0:
        return target_spec(int(target), batch, device)
    if tuple(target.shape) != (batch,):
        raise ValueError(
            f"a target tensor must have shape (B,) = ({batch},), one action per state, got {tuple(target.shape)}"
        )
    rows = target.detach().to(device=device, dtype=torch.int64)
    if rows.is_inference():
        rows = rows.clone()
    low, high = (int(v) for v in torch.stack([rows.min(), rows.max()]).tolist())  # one host sync
    if low < 0:
        raise ValueError(f"target indices must be >= 0, got {low}")
    return TargetSpec("per_row", target_label(target), rows=rows, rows_max=high)


def select(outputs: Any, spec: TargetSpec, n_rows: int, first_row: int, batch: int) -> Tensor:
    """The target values of one chunk of rows as ``(n_rows, T)``; rows ``first_row...`` of the ``(*, B)`` layout.

    Raises:
        TypeError: the forward returned no tensor, or no floating-point one.
        ValueError: the output's shape does not fit the target, or an index is out of range.
    """
    if not isinstance(outputs, Tensor):
        raise TypeError(f"forward must return a torch.Tensor, got {type(outputs).__name__}")
    if not outputs.dtype.is_floating_point:
        raise TypeError(f"forward must return floating-point values, got dtype {outputs.dtype}")
    if spec.kind == "output":
        return _select_output(outputs, n_rows)
    if spec.kind == "callable":
        return _select_callable(outputs, spec, n_rows)
    shape = tuple(outputs.shape)
    if len(shape) != 2 or shape[0] != n_rows:
        raise ValueError(
            f"with target={spec.label!r} forward must return (N, A) values, one row per input row ({n_rows} rows); got "
            f"{shape}"
        )
    if spec.kind == "mean":
        return outputs.mean(dim=1, keepdim=True)
    if spec.kind == "each":
        return outputs
    if spec.kind in ("contrast", "contrast_fixed"):
        assert spec.rows is not None  # noqa: S101 - the run fills the pairs before any forward of the path
        pairs = spec.rows[torch.arange(first_row, first_row + n_rows, device=outputs.device) % batch]  # (n, 2)
        chosen = outputs.gather(1, pairs)  # (n, 2): greedy, runner-up
        return chosen[:, :1] - chosen[:, 1:]
    actions = shape[1]
    if spec.kind == "action":
        assert spec.index is not None  # noqa: S101 - set for every "action" spec
        if spec.index >= actions:
            raise ValueError(
                f"target={spec.index} is out of range for a forward with {actions} outputs; use 0..{actions - 1}"
            )
        return outputs[:, spec.index : spec.index + 1]
    return _select_per_row(outputs, spec, n_rows, first_row, batch)


def choose_contrast(outputs: Any, batch: int) -> Tensor:
    """``(B, 2)``: each state's greedy output and its runner-up, from the forward's ``(B, A)`` at the states.

    The first of equal values wins (``argmax``'s rule on every device), so the choice is deterministic;
    no host synchronisation, so it runs inside a captured graph.

    Raises:
        TypeError: the forward returned no floating-point tensor.
        ValueError: not ``(B, A)`` with ``A >= 2`` (a contrast needs two outputs).
    """
    if not isinstance(outputs, Tensor) or not outputs.dtype.is_floating_point:
        raise TypeError(f"forward must return a floating-point tensor, got {type(outputs).__name__}")
    shape = tuple(outputs.shape)
    if len(shape) != 2 or shape[0] != batch or shape[1] < 2:
        raise ValueError(
            f"target='contrast' needs a forward returning (N, A) values with A >= 2 (the greedy output and the "
            f"runner-up); got {shape} for {batch} states"
        )
    values = outputs.detach()
    greedy = values.argmax(1)  # (B,)
    masked = values.scatter(1, greedy.unsqueeze(1), float("-inf"))
    return torch.stack([greedy, masked.argmax(1)], 1)


def check_rows_in_range(spec: TargetSpec, actions: int) -> None:
    """Raise when a per-row target holds an index past the forward's ``actions`` outputs."""
    if spec.rows_max >= actions:
        raise ValueError(
            f"target holds index {spec.rows_max}, out of range for a forward with {actions} outputs; use "
            f"0..{actions - 1}"
        )


def _select_output(outputs: Tensor, n_rows: int) -> Tensor:
    shape = tuple(outputs.shape)
    if shape == (n_rows,):
        return outputs.unsqueeze(1)
    if shape == (n_rows, 1):
        return outputs
    hint = (
        "; it returns several columns, so pass target='mean', an int, 'each' or a callable" if len(shape) == 2 else ""
    )
    raise ValueError(f"forward must return one value per row, shape ({n_rows},), for {n_rows} rows; got {shape}{hint}")


def _select_callable(outputs: Tensor, spec: TargetSpec, n_rows: int) -> Tensor:
    assert spec.fn is not None  # noqa: S101 - set for every "callable" spec
    values = spec.fn(outputs)
    if not isinstance(values, Tensor) or tuple(values.shape) not in ((n_rows,), (n_rows, 1)):
        seen = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise ValueError(f"the target callable must map the forward's output to shape ({n_rows},), got {seen}")
    return values.reshape(n_rows, 1)


def _select_per_row(outputs: Tensor, spec: TargetSpec, n_rows: int, first_row: int, batch: int) -> Tensor:
    assert spec.rows is not None  # noqa: S101 - set for every "per_row" spec
    check_rows_in_range(spec, outputs.shape[1])
    states = torch.arange(first_row, first_row + n_rows, device=outputs.device) % batch  # row r is state r % B
    return outputs.gather(1, spec.rows[states].unsqueeze(1))


def target_forward(model: Callable[[Tensor], Tensor], target: Target = "mean") -> Callable[[Tensor], Tensor]:
    """Turn a multi-output model into a forward that returns one value per row.

    Args:
        model: maps ``(N, *feature_shape)`` to ``(N, A)``, e.g. Q-values.
        target: ``"mean"`` (default; the mean over the ``A`` outputs, which is
            ``V(s)`` for a dueling network whose advantages are mean-centred),
            an int (one output column), or a callable mapping ``(N, A)`` to ``(N,)``.
            Per-state indices, ``"each"`` and ``"contrast"`` need the engine: pass them as
            ``integrated_gradients(model, x, target=...)`` instead.

    Returns:
        A callable ``(N, *feature_shape) -> (N,)``; its ``__wrapped__`` is ``model``.

    Raises:
        ValueError: ``target`` is ``"each"``, a tensor, or an unknown name.
        TypeError: ``model`` is not callable, or ``target`` has an unsupported type.

    Example::

        value = target_forward(q_network, "mean")
        result = integrated_gradients(value, states)
    """
    if not callable(model):
        raise TypeError(f"model must be callable (a module or a function of the inputs), got {type(model).__name__}")
    if target is None:
        return model
    if isinstance(target, Tensor) or (isinstance(target, str) and target in ("each", "contrast")):
        raise ValueError(
            f"target_forward cannot express target={'a tensor' if isinstance(target, Tensor) else repr(target)}; "
            "pass it to integrated_gradients(model, inputs, target=...) instead"
        )
    spec = target_spec(target, 1, torch.device("cpu"))

    def forward(inputs: Tensor) -> Tensor:
        return select(model(inputs), spec, inputs.shape[0], 0, inputs.shape[0]).squeeze(1)

    forward.__name__ = f"{getattr(model, '__name__', type(model).__name__)}[{spec.label}]"
    forward.__wrapped__ = model  # type: ignore[attr-defined]  # the engine's messages look through it to the model
    return forward
