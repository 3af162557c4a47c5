"""An IG result brought to the host: gathered over ranks, reduced on the device, copied once.

:class:`HostResult` is what the report, the statistics and the TensorBoard side read. :meth:`HostResult.from_result`
takes an :class:`~lightning_ig.attribution.IGResult` (or anything with its fields) and

1. packs each state's row, its attributions and its per-state numbers (``f_input``, ``f_baseline``, ``delta``,
   ``relative_error``, ``degenerate``, ``non_finite``, ``n_steps``, ``stochastic``, ``attribution_error``,
   ``mass_relative_error``), into one tensor ``(B, F + 10)``;
2. under DDP, passes it to ``gather`` once (``trainer.strategy.all_gather``: every rank makes the same single collective
   call with the same shape; the states are split with the last rank's share padded, and the padding rows are dropped
   here by ``num_states``);
3. reduces on the device, in float64: per-feature moments, per-state sums and masses (the near-baseline flags from the
   median over *all* gathered states), group sums; and copies to the host in one transfer only what is needed, so the
   host work grows with the number of features, not with states x features.

Everything is float64 numpy on the host; the same result gives the same numbers.
:meth:`HostResult.begin` queues the same work and returns a :class:`HostTransfer` without waiting for the
device: the callback reads it one training step later, so its attribution runs beside training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_ig.attribution.groups import FeatureGroups
from lightning_ig.attribution.result import COLUMNS as _COLUMNS
from lightning_ig.attribution.result import IGResult, near_baseline_states, pack, worst_over_ordinary

__all__ = ["HostResult", "HostTransfer", "Moments"]


@dataclass(frozen=True)
class Moments:
    """Statistics over the states of each of ``U`` units (features or groups), float64 ``(U,)`` each.

    Attributes:
        mean_abs: mean of ``|attr|``.
        stddev: population standard deviation of ``attr`` (the report's ``stddev``).
        mean_signed: mean of ``attr``.
    """

    mean_abs: np.ndarray
    stddev: np.ndarray
    mean_signed: np.ndarray

    @staticmethod
    def rows(values: Tensor) -> Tensor:
        """``(3, U)`` float64: mean |v|, std v, mean v over the rows of ``values (B, U)`` (ddof 0)."""
        values = values.to(torch.float64)
        mean_abs, mean_signed = values.abs().mean(0), values.mean(0)
        # Two passes (deviations from the mean), written out: torch's std over dim 0 is several times slower on CPUs.
        spread = (values - mean_signed).square_().mean(0).sqrt_()
        return torch.stack([mean_abs, spread, mean_signed])

    @classmethod
    def from_rows(cls, rows: np.ndarray) -> Moments:
        return cls(*(np.ascontiguousarray(row) for row in rows))

    @classmethod
    def of(cls, values: Tensor | np.ndarray) -> Moments:
        """The moments of ``values (B, U)`` (a tensor on any device or an array)."""
        tensor = torch.as_tensor(values)
        return cls.from_rows(cls.rows(tensor.reshape(tensor.shape[0], -1)).cpu().numpy())


@dataclass(frozen=True)
class HostResult:
    """One IG run on the host, all states gathered (float64 numpy).

    Attributes:
        feature_shape: the shape of one state.
        f_input, f_baseline, delta, relative_error: ``(B,)`` as the engine computed them.
        degenerate: ``(B,)`` bool: ``|F(x) - F(b)|`` too small for a relative error.
        non_finite: ``(B,)`` bool: ``F(x)``, ``F(b)`` or an attribution of the state is NaN/Inf.
        sum_attributions: ``(B,)`` the sum of each state's attributions.
        features: per-feature :class:`Moments`, ``(F,)`` each.
        attributions: ``(B, F)`` when kept (``keep_attributions``), else ``None``.
        sample_attributions: ``(S, *feature_shape)``: the first ``sample_states`` states' attributions.
        groups: the :class:`~lightning_ig.attribution.groups.FeatureGroups`, or ``None``.
        group_attributions: ``(B, G)`` per-state group sums, or ``None``.
        n_steps, method, gradient, backend, target: the run's settings (``n_steps``: the most any state used).
        stochastic: the forward gave different values on the same rows (any rank).
        attribution_error: ``(B,)`` the engine's error estimate per state (NaN where the result had none).
        mass_relative_error: ``(B,)`` ``|sum(a) - dF| / max(sum|a|, |dF|)``.
        near_baseline: ``(B,)`` bool: ``max(||a||_1, |F(x) - F(b)|)`` below a tenth of the median over all gathered
            states.
        attribution_mass: ``(B,)`` ``||a||_1``.
        n_steps_per_state: ``(B,)`` the points each state used.
    """

    feature_shape: tuple[int, ...]
    f_input: np.ndarray
    f_baseline: np.ndarray
    delta: np.ndarray
    relative_error: np.ndarray
    degenerate: np.ndarray
    non_finite: np.ndarray
    sum_attributions: np.ndarray
    features: Moments
    attributions: np.ndarray | None
    sample_attributions: np.ndarray
    groups: FeatureGroups | None
    group_attributions: np.ndarray | None
    n_steps: int
    method: str
    gradient: str
    backend: str
    target: str
    stochastic: bool
    attribution_error: np.ndarray | None = None
    mass_relative_error: np.ndarray | None = None
    near_baseline: np.ndarray | None = None
    attribution_mass: np.ndarray | None = None
    n_steps_per_state: np.ndarray | None = None

    @property
    def worst_attribution_error(self) -> float:
        """The largest estimated attribution error over the ordinary states (``inf`` with a non-finite state)."""
        return self._worst(self.attribution_error)

    @property
    def worst_mass_relative_error(self) -> float:
        """The largest mass-relative completeness error over the ordinary states (``inf`` with a non-finite state)."""
        return self._worst(self.mass_relative_error)

    @property
    def num_near_baseline(self) -> int:
        """How many states are near the baseline (flagged, not scored)."""
        return 0 if self.near_baseline is None else int(self.near_baseline.sum())

    def _worst(self, values: np.ndarray | None) -> float:
        figure = np.full(self.num_states, np.nan) if values is None else values
        near = np.zeros(self.num_states, dtype=bool) if self.near_baseline is None else self.near_baseline
        return worst_over_ordinary(torch.from_numpy(figure), torch.from_numpy(near), torch.from_numpy(self.non_finite))

    @property
    def num_states(self) -> int:
        return int(self.f_input.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.features.mean_abs.shape[0])

    @property
    def group_moments(self) -> Moments | None:
        """Per-group :class:`Moments` of the group attributions (a group read as one feature)."""
        return None if self.group_attributions is None else Moments.of(self.group_attributions)

    @classmethod
    def from_result(
        cls,
        result: IGResult | HostResult,
        *,
        gather: Callable[[Tensor], Tensor] | None = None,
        num_states: int | None = None,
        groups: FeatureGroups | None = None,
        keep_attributions: bool = False,
        sample_states: int = 0,
    ) -> HostResult:
        """Gather ``result`` (when ``gather`` is given), reduce it on its device and copy it to the host once.

        The same as :meth:`begin` followed by :meth:`HostTransfer.result` (which waits for the copy).
        """
        if isinstance(result, HostResult):
            return result
        return cls.begin(
            result,
            gather=gather,
            num_states=num_states,
            groups=groups,
            keep_attributions=keep_attributions,
            sample_states=sample_states,
        ).result()

    @classmethod
    def begin(
        cls,
        result: IGResult,
        *,
        gather: Callable[[Tensor], Tensor] | None = None,
        num_states: int | None = None,
        groups: FeatureGroups | None = None,
        keep_attributions: bool = False,
        sample_states: int = 0,
    ) -> HostTransfer:
        """Gather ``result`` (when ``gather`` is given), queue its reductions and its one copy to the host.

        Nothing here waits for the device: on CUDA the copy goes to pinned memory behind an event, so the caller can go
        on queuing work (the next training step) and read the host result later (:meth:`HostTransfer.result`). The
        collective, when there is one, is made here: every rank calls ``begin`` at the same point.

        Args:
            result: an :class:`~lightning_ig.attribution.IGResult` with one
                attribution per state (not ``target="each"``).
            gather: ``trainer.strategy.all_gather`` under DDP (or a
                :class:`~lightning_ig.run.gather.JointGather`, which sends other rows along): called once
                with this rank's packed ``(share, F + 10)`` tensor, returns ``(world, share, F + 10)``.
            num_states: keep the first this many gathered rows (drops the padding of an uneven split).
            groups: also sum the attributions per group (``group_attributions``).
            keep_attributions: also copy all ``(B, F)`` attributions (for histograms).
            sample_states: also copy the attributions of the first this many states (for saliency maps).

        Returns:
            The transfer, whose :meth:`~HostTransfer.result` is the host result.

        Raises:
            ValueError: the result holds one attribution set per action (``target="each"``).
        """
        packed, feature_shape = pack(result)
        if gather is not None:
            packed = gather(packed).reshape(-1, packed.shape[-1])  # (world * share, F + 10): rank-major = state order
        if num_states is not None:
            packed = packed[:num_states]
        count = packed.shape[1] - len(_COLUMNS)
        flat, layout = _reduce_rows(packed[:, :count], packed[:, count:].T, groups, keep_attributions, sample_states)
        labels = {"method": str(result.method), "gradient": str(result.gradient), "backend": str(result.backend)}
        labels["target"] = str(getattr(result, "target", ""))
        settings = (int(result.n_steps), labels, feature_shape, *layout, groups)
        return HostTransfer(flat, lambda host: cls._unpack(host, *settings))

    @classmethod
    def _unpack(
        cls,
        host: np.ndarray,
        n_steps: int,
        labels: dict[str, Any],
        feature_shape: tuple[int, ...],
        rows: int,
        count: int,
        samples: int,
        groups: FeatureGroups | None,
    ) -> HostResult:
        sizes = [
            len(_COLUMNS) * rows,
            3 * rows,
            3 * count,
            samples * count,
            0 if groups is None else rows * len(groups),
        ]
        offsets = np.cumsum([0, *sizes])
        columns = dict(zip(_COLUMNS, host[: offsets[1]].reshape(len(_COLUMNS), rows)))
        sums, mass, near = host[offsets[1] : offsets[2]].reshape(3, rows)
        kept = host[offsets[5] :]
        # A state is non-finite when the engine says so or its numbers are (either way: never a clean state).
        non_finite = (columns["non_finite"] != 0) | ~(
            np.isfinite(columns["f_input"]) & np.isfinite(columns["f_baseline"]) & np.isfinite(sums)
        )
        return cls(
            feature_shape=feature_shape,
            f_input=columns["f_input"],
            f_baseline=columns["f_baseline"],
            delta=columns["delta"],
            relative_error=columns["relative_error"],
            degenerate=(columns["degenerate"] != 0) & ~non_finite,
            non_finite=non_finite,
            sum_attributions=sums,
            features=Moments.from_rows(host[offsets[2] : offsets[3]].reshape(3, count)),
            attributions=kept.reshape(rows, count) if kept.size else None,
            sample_attributions=host[offsets[3] : offsets[4]].reshape(samples, *feature_shape),
            groups=groups,
            group_attributions=None if groups is None else host[offsets[4] : offsets[5]].reshape(rows, len(groups)),
            n_steps=int(columns["n_steps"].max()) if rows else n_steps,
            stochastic=bool((columns["stochastic"] != 0).any()),
            attribution_error=columns["attribution_error"],
            mass_relative_error=_mass_relative(columns, sums, mass),
            near_baseline=near != 0,
            attribution_mass=mass,
            n_steps_per_state=columns["n_steps"].astype(np.int64),
            **labels,
        )


class HostTransfer:
    """A run's reduced numbers on their way to the host: the copy is queued, :meth:`result` reads them.

    On a CUDA device the flat float64 tensor is copied into pinned host memory with ``non_blocking=True`` and an
    event is recorded behind it: the training thread does not wait for the attribution to finish. On the CPU the
    numbers are there at once.

    Args:
        flat: the reduced numbers, one flat tensor on the result's device.
        unpack: turns the host array into the :class:`HostResult`.
    """

    def __init__(self, flat: Tensor, unpack: Callable[[np.ndarray], HostResult]) -> None:
        self._unpack = unpack
        self._event: torch.cuda.Event | None = None
        if flat.is_cuda:
            # Pinned memory comes from torch's caching host allocator: the same block every run, no new allocation.
            self._host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            self._host.copy_(flat, non_blocking=True)
            self._flat = flat  # held until the copy is read: never a block another stream could take mid-copy
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = flat
        self._result: HostResult | None = None

    def ready(self) -> bool:
        """Whether the copy has landed: :meth:`result` would not wait (asks the device; never waits)."""
        return self._event is None or self._event.query()

    def result(self) -> HostResult:
        """The host result; waits for the copy the first time if it has not landed yet."""
        if self._result is None:
            if self._event is not None:
                self._event.synchronize()
            self._result = self._unpack(self._host.numpy())
        return self._result


def _reduce_rows(
    values: Tensor, columns: Tensor, groups: FeatureGroups | None, keep_attributions: bool, sample_states: int
) -> tuple[Tensor, tuple[int, int, int]]:
    """A run's reductions on its device, in float64, as one flat tensor and its layout ``(rows, features, samples)``.
    ``values (B, F)`` are the attributions, ``columns (10, B)`` the per-state numbers in :func:`pack`'s order. No host
    sync and no shape that depends on the values, so the training loop never waits for it."""
    values = values.to(torch.float64)  # (B, F)
    sums = values.sum(1)  # (B,)
    mass = values.abs().sum(1)  # (B,)
    change = (columns[0] - columns[1]).to(torch.float64).abs()  # |F(x) - F(b)|: pack's first two columns
    near = near_baseline_states(torch.maximum(mass, change)).to(torch.float64)  # the median over all gathered states
    pieces = [columns.to(torch.float64).reshape(-1), sums, mass, near, Moments.rows(values).reshape(-1)]
    samples = values[: max(0, int(sample_states))]
    pieces.append(samples.reshape(-1))
    if groups is not None:
        pieces.append(groups.sum(values).reshape(-1))  # (B, G) float64
    if keep_attributions:
        pieces.append(values.reshape(-1))
    return torch.cat(pieces), (values.shape[0], values.shape[1], samples.shape[0])


def _mass_relative(columns: dict[str, np.ndarray], sums: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """The engine's mass-relative errors; computed here for a result that did not carry them (NaN columns)."""
    given = columns["mass_relative_error"]
    if not (missing := np.isnan(given)).any():
        return given
    with np.errstate(invalid="ignore", divide="ignore"):  # inf - inf where both ends are infinite: NaN, said
        change = np.abs(columns["f_input"] - columns["f_baseline"])
        scale = np.maximum(mass, change)
        error = np.abs(sums - (columns["f_input"] - columns["f_baseline"])) / scale
    return np.where(missing, np.where(scale > 0, error, np.where(scale == 0, 0.0, np.nan)), given)  # NaN stays NaN
