"""What to attribute: the one :class:`Target` every consumer reads, and how it selects the attributed values.

A forward maps ``(N, *feature_shape)`` to one value per row ``(N,)``, or to ``(N, A)`` (Q-values, say) with a *target*
choosing what to attribute: ``None`` (the forward's own ``(N,)``), ``"mean"`` (the mean over ``A``: ``V(s)`` of a
dueling network whose advantages are mean-centred), an int (one column), a LongTensor ``(B,)`` (one column per state),
``"each"`` (every column), ``"contrast"`` (per state, the greedy column minus the runner-up's: "why this action rather
than the next best") or a callable ``(N, A) -> (N,)``.

:meth:`Target.parse` checks the user's value once where it comes in, :meth:`Target.bind` fits it to a model's outputs;
every consumer asks the :class:`Target` instead of testing the user's value (``docs/ARCHITECTURE.md``, contracts).
The engine runs the forward on rows laid out ``(*, B)``: row ``r`` belongs to state ``r % B``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import numpy as np
import torch
from torch import Tensor

from lightning_ig.attribution.checks import check_dense
from lightning_ig.vocabulary import TARGET_NAMES, action_index, callable_name, shown, shown_with_type

__all__ = ["EACH", "Target", "TargetLike", "action_labels", "check_rows_in_range", "choose_contrast", "target_forward"]

TargetLike = Union[None, str, int, Tensor, Callable[[Tensor], Tensor], "Target"]
"""What ``target=`` takes: ``None``, a name of :data:`~lightning_ig.vocabulary.TARGET_NAMES`, an output index, a
LongTensor of one index per state, a callable ``(N, A) -> (N,)``, or a :class:`Target`."""

_FORMS = (
    "None, 'mean', 'each', 'contrast', an int, 'action:N' (N in digits 0-9), a LongTensor of shape (B,) or a callable"
)
_Kind = Literal["output", "mean", "action", "per_row", "each", "contrast", "callable"]


@dataclass(frozen=True, eq=False)
class Target:
    """What is attributed, checked once (:meth:`parse`), and what every consumer needs to know of it.

    The answers consumers ask for are plain attributes, set when the target is made, so that a run reads them
    without entering this module.

    Attributes:
        kind: ``"output"`` (the forward's own value per row), ``"mean"``, ``"action"`` (one output),
            ``"per_row"`` (one output per state), ``"each"``, ``"contrast"`` or ``"callable"``.
        label: what was attributed in one spelling: ``output``, ``mean``, ``action:<k>``, ``per_row``, ``each``,
            ``contrast``, ``callable:<name>``; the result's ``target``, the report's ``forward_target``, the text.
        index: the output of ``"action"``.
        fn: the callable of ``"callable"``.
        rows: ``(B,)`` int64, each state's output (``"per_row"``, once on the inputs' device: :meth:`on`), or
            ``(B, 2)`` each state's greedy and runner-up outputs (``"contrast"``, filled by the run).
        rows_max: the largest index in ``rows`` (``"per_row"``), checked against the forward's outputs.
        pairs_fixed: a contrast whose pairs were chosen already (a sub-batch of ``n_steps="auto"``).
        actions: one label per output once bound to a model (:meth:`bind`) for ``"each"`` and ``"contrast"``,
            and for ``"action"`` when names were given; else ``None``.
        every_output: every output is attributed in one run: results ``(A, B, ...)``, a run's rows a (state, action)
            pair each.
        contrasts: per state the greedy output minus the runner-up's, the pair chosen at the state.
        chooses_pairs: a contrast whose run chooses each state's pair from the forward at the state.
        by_state: each state picks its own outputs (per-state indices, a contrast's pairs).
        about_actions: one action, every action or the greedy one against the next: action names apply.
        same_each_call: nothing changes between an engine's calls (no per-state indices to copy in, no callable,
            which a captured graph holds by identity): the engine's fast replay applies.
        checks_deletion: the deletion check applies: a deleted state's forward re-states the target (not a
            contrast, whose pair is chosen at each state and held fixed).
        rows_per_state: the rows of a state in a run: the actions for ``"each"`` (once bound), else 1.
    """

    kind: _Kind
    label: str
    index: int | None = None
    fn: Callable[[Tensor], Tensor] | None = None
    rows: Tensor | None = None
    rows_max: int = 0
    pairs_fixed: bool = False
    actions: tuple[str, ...] | None = None
    every_output: bool = field(init=False, repr=False)
    contrasts: bool = field(init=False, repr=False)
    chooses_pairs: bool = field(init=False, repr=False)
    by_state: bool = field(init=False, repr=False)
    about_actions: bool = field(init=False, repr=False)
    same_each_call: bool = field(init=False, repr=False)
    checks_deletion: bool = field(init=False, repr=False)
    rows_per_state: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        kind, derived = self.kind, object.__setattr__
        derived(self, "every_output", kind == "each")
        derived(self, "contrasts", kind == "contrast")
        derived(self, "chooses_pairs", kind == "contrast" and not self.pairs_fixed)
        derived(self, "by_state", kind in ("per_row", "contrast"))
        derived(self, "about_actions", kind in ("action", "each", "contrast"))
        derived(self, "same_each_call", kind not in ("per_row", "callable"))
        derived(self, "checks_deletion", kind not in ("contrast", "per_row"))
        derived(self, "rows_per_state", len(self.actions) if kind == "each" and self.actions else 1)

    # -- made once, where the user's value comes in

    @classmethod
    def parse(cls, value: TargetLike) -> Target:
        """``value`` checked (a :class:`Target` is returned as it is).

        Raises:
            TypeError: a bool, a float or bool tensor, or an unsupported type.
            ValueError: an unknown name, a negative index, or a sparse or meta-device tensor.
        """
        if isinstance(value, Target):
            return value
        if value is None:
            return cls("output", "output")
        if isinstance(value, str):
            return _named(value)
        if isinstance(value, (bool, np.bool_)):
            raise TypeError(f"target must be an int action index, not a bool ({value!r})")
        if isinstance(value, (int, np.integer)):
            if value < 0:
                raise ValueError(f"target must be a non-negative action index, got {value}")
            return cls("action", f"action:{int(value)}", index=int(value))
        if isinstance(value, Tensor):
            if value.dtype.is_floating_point or value.dtype == torch.bool or value.dtype.is_complex:
                raise TypeError(f"a target tensor must hold integer action indices, got dtype {value.dtype}")
            check_dense(value, "target")
            if value.dim() == 0:
                return cls.parse(int(value))
            return cls("per_row", "per_row", rows=value)  # its shape is checked against the batch (on)
        if callable(value):
            return cls("callable", f"callable:{callable_name(value)}", fn=value)
        raise TypeError(f"target must be {_FORMS}, got {shown_with_type(value)}")

    @classmethod
    def of_forward(cls, forward: Any) -> Target:
        """A forward of the user's that returns the attributed value itself (the callback's ``forward=``)."""
        return cls("output", f"callable:{callable_name(forward)}")

    def on(self, batch: int, device: torch.device) -> Target:
        """This target for ``batch`` states on ``device``: per-state indices checked and moved (one host sync).

        Raises:
            ValueError: per-state indices of another count than ``batch``, or a negative one.
        """
        if self.kind != "per_row" or self.rows is None:
            return self
        if tuple(self.rows.shape) != (batch,):
            raise ValueError(
                f"a target tensor must have shape (B,) = ({batch},), one action per state, got {tuple(self.rows.shape)}"
            )
        rows = self.rows.detach().to(device=device, dtype=torch.int64)
        if rows.is_inference():
            rows = rows.clone()
        low, high = (int(v) for v in torch.stack([rows.min(), rows.max()]).tolist())  # one host sync
        if low < 0:
            raise ValueError(f"target indices must be >= 0, got {low}")
        return dataclasses.replace(self, rows=rows, rows_max=high)

    def bind(self, shape: Sequence[int], names: Sequence[str] | None = None, *, spelt: str | None = None) -> Target:
        """This target for a model whose outputs per batch have ``shape`` (``(N,)`` or ``(N, A)``).

        ``"mean"`` or output 0 of a model with one value per state attributes that value (``"output"``); ``"each"``
        and ``"contrast"`` get one label per action (``names``, or ``action 0``, ``action 1``, ...), an output index
        its name where ``names`` are given.

        Args:
            shape: the model's output shape on a batch, ``(N,)`` or ``(N, A)``.
            names: one name per output, or ``None``.
            spelt: how the messages name the target (default ``target=<value>``; the command line's ``--target N``).

        Raises:
            ValueError: ``"each"`` or ``"contrast"`` on fewer than two outputs, an index out of range, or a number of
                names other than the outputs'.
        """
        said, mean = (spelt, f"{spelt.split()[0]} mean") if spelt else (f"target={self.as_given!r}", "target='mean'")
        outputs = 1 if len(shape) == 1 else int(shape[1])
        if self.kind in ("each", "contrast") and (len(shape) == 1 or outputs < 2):
            needs = "one per action" if self.kind == "each" else "the greedy action and the runner-up"
            raise ValueError(
                f"{said} needs at least two outputs per state ({needs}); the model returns {outputs}: use {mean} or an "
                "output index"
            )
        if self.kind == "action" and self.index is not None and self.index >= outputs:
            valid = f"{mean} or 0" if outputs == 1 else f"an index in [0, {outputs - 1}]"
            raise ValueError(
                f"{said} is out of range: the model returns {outputs} output{'s' * (outputs > 1)} per state; "
                f"pass {valid}"
            )
        labels = None if names is None and self.kind not in ("each", "contrast") else action_labels(names, outputs)
        if outputs == 1 and self.kind in ("mean", "action"):  # (N,) or (N, 1): one value per state
            return Target("output", "output")
        return self if labels is None or not self.about_actions else dataclasses.replace(self, actions=tuple(labels))

    # -- what consumers ask

    @property
    def as_given(self) -> Any:
        """The target as a user spells it: a name, an output index or a callable's name (the callback's state key)."""
        if self.kind == "action":
            return self.index
        return self.label.partition(":")[2] if self.label.startswith("callable:") else self.label

    @property
    def words(self) -> str:
        """What is attributed, as the pictures' legends name it: ``V(s)``, ``Q(s, left)``, ``Q(s, a)``, ..."""
        if self.kind == "action":
            names = self.actions or ()
            return f"Q(s, {names[self.index] if self.index is not None and self.index < len(names) else self.index})"
        return _WORDS.get(self.kind) or self._name() or "the output"

    @property
    def unit(self) -> str:
        """The unit of the attributions, for the text: they add up to a change of this."""
        if self.kind == "action":
            return self.words  # named as the header names it: Q(s, <name>) where action_names are given
        return _UNITS.get(self.kind) or self._name() or "model output"

    def key(self) -> tuple[Any, ...]:
        """What a captured graph depends on: per-row indices are copied in, not part of the key."""
        if self.kind == "per_row":
            return ("per_row", tuple(self.rows.shape) if self.rows is not None else ())
        return ("callable", id(self.fn)) if self.kind == "callable" else (self.kind, self.index, self.pairs_fixed)

    def subset(self, states: Tensor) -> Target:
        """The target of the states ``states`` (indices) only: their rows, a contrast's pairs fixed."""
        rows = None if self.rows is None else self.rows[states]
        return dataclasses.replace(self, rows=rows, pairs_fixed=self.kind == "contrast")

    def select(self, outputs: Any, n_rows: int, states: Callable[[], Tensor]) -> Tensor:
        """The attributed values ``(n_rows, T)`` of a forward's ``outputs``; ``states()`` gives each row's state.

        Raises:
            TypeError: the forward returned no tensor, or no floating-point one.
            ValueError: the output's shape does not fit the target, or an index is out of range.
        """
        if not isinstance(outputs, Tensor):
            kind = type(outputs).__name__  # a tuple or dict: the caller picks the output to attribute
            key = next(iter(outputs), 0) if isinstance(outputs, dict) else 0  # a dict's first key, not [0]
            raise TypeError(
                f"forward must return a torch.Tensor, got {kind}; pick one, e.g. forward=lambda x: model(x)[{key!r}]"
            )
        if not outputs.dtype.is_floating_point:
            raise TypeError(f"forward must return floating-point values, got dtype {outputs.dtype}")
        if self.kind == "output":
            return _select_output(outputs, n_rows)
        if self.kind == "callable":
            return self._select_callable(outputs, n_rows)
        shape = tuple(outputs.shape)
        if self.kind == "mean" and shape == (n_rows,):  # one value per row is its own mean (the callback's reading)
            return outputs.unsqueeze(1)
        if len(shape) != 2 or shape[0] != n_rows:
            hint = "; a forward with one output per row takes target=None" if shape == (n_rows,) else ""
            given = self.index if self.kind == "action" else "a tensor" if self.kind == "per_row" else repr(self.label)
            raise ValueError(
                f"with target={given} forward must return (N, A) values, one row per input row; got {shape} "
                f"for {n_rows} rows (the path's points, in chunks){hint}"
            )
        if self.kind == "mean":
            return outputs.mean(dim=1, keepdim=True)
        if self.kind == "each":
            return outputs
        if self.kind == "action":
            if self.index >= shape[1]:  # type: ignore[operator]  # set for every "action" target
                raise ValueError(
                    f"target={self.index} is out of range for a forward with {shape[1]} outputs; use 0..{shape[1] - 1}"
                )
            return outputs[:, self.index : self.index + 1]  # type: ignore[operator]
        if self.rows is None:
            raise RuntimeError(f"target={self.label!r} was used before its rows were set")
        if self.kind == "contrast":
            chosen = outputs.gather(1, self.rows[states()])  # (n, 2): greedy, runner-up
            return chosen[:, :1] - chosen[:, 1:]
        check_rows_in_range(self, shape[1])
        return outputs.gather(1, self.rows[states()].unsqueeze(1))

    def _select_callable(self, outputs: Tensor, n_rows: int) -> Tensor:
        values = self.fn(outputs)  # type: ignore[misc]  # set for every "callable" target
        if not isinstance(values, Tensor) or tuple(values.shape) not in ((n_rows,), (n_rows, 1)):
            seen = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
            raise ValueError(
                f"the target callable must map the forward's output {tuple(outputs.shape)} to one value per row, "
                f"shape ({n_rows},) (rows: points on the states' paths, in chunks), got {seen}"
            )
        if not values.dtype.is_floating_point:
            raise TypeError(
                f"the target callable must return the values to attribute (floating point), got dtype {values.dtype}: "
                "return a value (e.g. q.max(dim=1).values), not an index (q.argmax(dim=1))"
            )
        return values.reshape(n_rows, 1)

    def _name(self) -> str | None:  # "the output" for a lambda ("<lambda>" says nothing); "f", not "main.<locals>.f"
        name = self.label.partition(":")[2].rpartition(".")[2] if self.label.startswith("callable:") else ""
        return None if name.endswith("<lambda>") else name or None


EACH = Target("each", "each")
"""Every output: what finite differences evaluate for targets that pick their outputs by state."""

_WORDS = {"mean": "V(s)", "each": "Q(s, a)", "contrast": "Q(greedy) − Q(runner-up)"}
_UNITS = {"mean": "mean output = V(s)", "each": "Q(s, a) of every action", "contrast": "Q(greedy) - Q(runner-up)"}


def _named(text: str) -> Target:
    if text in TARGET_NAMES:
        return Target(text, text)  # type: ignore[arg-type]  # one of the kinds
    if text.startswith("action:") and (index := action_index(text)) is not None:  # digits 0-9, as documented
        return Target.parse(index)
    raise ValueError(
        f"target must be {_FORMS}, got {shown(text, 60)}; use 'mean' for V(s) of a dueling network or an int for one "
        "action"
    )


def action_labels(names: Sequence[str] | None, count: int) -> list[str]:
    """One label per action: the names given, or ``action 0``, ``action 1``, ...

    Raises:
        ValueError: a number of names other than ``count``.
    """
    if names is None:
        return [f"action {index}" for index in range(count)]
    if len(names) != count:
        raise ValueError(
            f"action_names has {len(names)} names but the model returns {count} actions; give one name per output"
        )
    return [str(name) for name in names]


def choose_contrast(outputs: Any, batch: int) -> Tensor:
    """``(B, 2)``: each state's greedy output and its runner-up, from the forward's ``(B, A)`` at the states.

    The first of equal values wins (``argmax``'s rule on every device), so the choice is deterministic;
    no host synchronisation, so it runs inside a captured graph.

    Raises:
        TypeError: the forward returned no floating-point tensor.
        ValueError: not ``(B, A)`` with ``A >= 2`` (a contrast needs two outputs).
    """
    if not isinstance(outputs, Tensor) or not outputs.dtype.is_floating_point:
        seen = f"dtype {outputs.dtype}" if isinstance(outputs, Tensor) else type(outputs).__name__
        raise TypeError(f"forward must return a floating-point tensor, got {seen}")
    if len(shape := tuple(outputs.shape)) != 2 or shape[0] != batch or shape[1] < 2:
        raise ValueError(
            f"target='contrast' needs a forward returning (N, A) values with A >= 2 (the greedy output and the "
            f"runner-up); got {shape} for {batch} states"
        )
    values = outputs.detach()
    greedy = values.argmax(1)  # (B,)
    masked = values.scatter(1, greedy.unsqueeze(1), float("-inf"))
    return torch.stack([greedy, masked.argmax(1)], 1)


def check_rows_in_range(target: Target, actions: int) -> None:
    """Raise when a per-row target holds an index past the forward's ``actions`` outputs."""
    if target.rows_max >= actions:
        raise ValueError(
            f"target holds index {target.rows_max}, out of range for a forward with {actions} outputs; use "
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
    raise ValueError(
        f"forward must return one value per row: shape ({n_rows},) for the {n_rows} rows it was given "
        f"(points on the states' paths, in chunks), got {shape}{hint}"
    )


def target_forward(model: Callable[[Tensor], Tensor], target: TargetLike = "mean") -> Callable[[Tensor], Tensor]:
    """Turn a multi-output model into a forward that returns one value per row.

    Args:
        model: maps ``(N, *feature_shape)`` to ``(N, A)``, e.g. Q-values.
        target: ``"mean"`` (default; the mean over the ``A`` outputs, which is ``V(s)`` for a dueling network whose
            advantages are mean-centred), an int (one output column), or a callable mapping ``(N, A)`` to ``(N,)``.
            Per-state indices, ``"each"`` and ``"contrast"`` need the engine: pass them as ``integrated_gradients(model,
            x, target=...)`` instead.

    Returns:
        A callable ``(N, *feature_shape) -> (N,)``; its ``__wrapped__`` is ``model``.

    Raises:
        ValueError: ``target`` is ``"each"``, ``"contrast"``, a tensor, or an unknown name.
        TypeError: ``model`` is not callable, or ``target`` has an unsupported type.

    Example::

        value = target_forward(q_network, "mean")
        result = integrated_gradients(value, states)
    """
    if not callable(model):
        raise TypeError(f"model must be callable (a module or a function of the inputs), got {type(model).__name__}")
    if target is None:
        return model
    checked = Target.parse(target)
    if checked.by_state or checked.every_output:
        raise ValueError(
            f"target_forward cannot express target={'a tensor' if checked.kind == 'per_row' else repr(checked.label)}; "
            "pass it to integrated_gradients(model, inputs, target=...) instead"
        )

    def forward(inputs: Tensor) -> Tensor:
        return checked.select(model(inputs), inputs.shape[0], _no_states).squeeze(1)

    forward.__name__ = f"{getattr(model, '__name__', type(model).__name__)}[{checked.label}]"
    forward.__wrapped__ = model  # type: ignore[attr-defined]  # the engine's messages look through it to the model
    return forward


def _no_states() -> Tensor:  # pragma: no cover - only targets that pick by state ask, and target_forward has none
    raise RuntimeError("target_forward's targets pick no outputs by state")
