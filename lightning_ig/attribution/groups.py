"""Feature groups: attribute to channels, families of features or any partition of the input.

A *group* is a set of input features whose attributions are added up, so it reads as one feature: Captum's
``feature_mask`` semantics, where an integer mask of the feature shape gives each feature a group id and equal ids form
one group. Because a group's attribution is the sum of its members', completeness holds per state for groups exactly as
for features: ``sum over groups = sum over features = F(x) - F(b)`` (up to rounding).

:class:`FeatureGroups` is built from any accepted form by :meth:`FeatureGroups.resolve`:

* ``"features"``: one group per feature (the names are the feature names);
* ``"channels"``: one group per index of dim 0 of a ``(C, H, W)`` or ``(C, L)`` state, named ``channel 0``,
  ``channel 1``, ...;
* an integer mask (tensor or array) of the feature shape, or broadcastable to it (``(H, W)`` groups the same pixel of
  every channel), optionally with a leading batch dimension of 1 as Captum writes them: equal ids form a group. Ids must
  be >= 0; they need not be contiguous (``{0, 2, 7}`` gives 3 groups, kept in increasing id order and named ``group 0``,
  ``group 2``, ``group 7``);
* a dict ``{name: index list | bool mask}``: flat indices into the flattened state, or a bool mask of (broadcastable to)
  the feature shape. A feature may belong to one group only; features in none form one more group, ``other``.

Sums are deterministic: equal-sized contiguous groups (features, channels, blocks) are a reshape and a sum; any other
partition is a permutation and a segmented sum. Neither uses floating-point atomics, so the same attributions give
bit-identical group sums on the same device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lightning_ig.vocabulary import (
    check_bool,
    check_feature_names,
    check_int,
    check_int_sequence,
    check_names,
    check_positive_int,
    check_text,
    default_feature_names,
    shown,
)

__all__ = ["FeatureGroups", "GroupSpec", "check_group_spec"]

_OTHER = "other"


class FeatureGroups:
    """A partition of the flattened features of a state into named groups.

    Build one with :meth:`resolve` (any accepted form), :meth:`channels`, :meth:`features` or :meth:`blocks`.

    Attributes:
        names: one name per group, ``G`` of them.
        ids: ``(F,)`` int64 on the CPU: the group index ``0..G-1`` of each flattened feature.
        sizes: ``(G,)`` int64 on the CPU: how many features each group holds (all >= 1).
        feature_shape: the shape of one state.
        generated_names: the names were made here (``channel 0``, ``group 3``, ``x0..x7``), not given.

    Example::

        >>> groups = FeatureGroups.resolve("channels", (4, 84, 84))
        >>> groups.names
        ['channel 0', 'channel 1', 'channel 2', 'channel 3']
        >>> groups.sum(torch.ones(2, 4, 84, 84)).shape
        torch.Size([2, 4])
    """

    def __init__(
        self, ids: Tensor, names: Sequence[str], feature_shape: Sequence[int], *, generated_names: bool = False
    ) -> None:
        """Groups from ``ids (F,)``, the group ``0..G-1`` of each flattened feature, and one name per group.

        Raises:
            TypeError: ``ids`` is not an integer tensor, ``names`` not a list of strings, ``feature_shape`` not a
                sequence of ints, ``generated_names`` not a bool.
            ValueError: ``ids`` of another size than the feature shape, a negative id, a group with no feature (the ids
                skip a number), or ``names`` of another count than the groups.
        """
        self.generated_names = check_bool(generated_names, "generated_names")
        self.feature_shape = _feature_shape(feature_shape)
        if not isinstance(ids, Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            kind = f"a tensor of dtype {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
            raise TypeError(f"ids must be an integer tensor of group indices, one per feature, got {kind}")
        self.ids = ids.to("cpu", torch.int64).reshape(-1)  # (F,)
        if self.ids.numel() != math.prod(self.feature_shape):
            raise ValueError(f"ids has {self.ids.numel()} entries for feature shape {self.feature_shape}")
        if int(self.ids.min()) < 0:
            raise ValueError(f"ids must be group indices >= 0, got {int(self.ids.min())}")
        self.sizes = torch.bincount(self.ids)  # (G,)
        if (empty := (self.sizes == 0).nonzero().reshape(-1)).numel():
            raise ValueError(
                f"ids leave group {int(empty[0])} without a feature; number the groups 0..G-1 with every number used"
            )
        self.names = _group_names(names, len(self.sizes), "names")
        # The members of group 0 first, then group 1, ...; in feature order within a group.
        self._order = torch.argsort(self.ids, stable=True)  # (F,)
        uniform = bool((self.sizes == self.sizes[0]).all()) and torch.equal(self._order, torch.arange(self.ids.numel()))
        self._block = int(self.sizes[0]) if uniform else None  # contiguous groups of one size: a reshape
        self._device_cache: dict[torch.device, tuple[Tensor, Tensor]] = {}

    # ------------------------------------------------------------------ building

    def renamed(self, names: Sequence[str], what: str = "names") -> FeatureGroups:
        """These groups under ``names``: one distinct, printable name per group (``what`` names them in errors).

        Raises:
            TypeError, ValueError: not one distinct, printable, non-blank string per group.
        """
        renamed = _group_names(names, len(self), check_text(what, "what"), self.names)
        return FeatureGroups(self.ids, renamed, self.feature_shape)

    @classmethod
    def resolve(
        cls, groups: GroupSpec, feature_shape: Sequence[int], names: Sequence[str] | None = None
    ) -> FeatureGroups:
        """Build the groups of ``groups`` for states of ``feature_shape``.

        Args:
            groups: a :class:`FeatureGroups` (checked against ``feature_shape``), ``"features"``, ``"channels"``, an
                integer mask, or a dict ``{name: index list | bool mask}`` (see the module docstring).
            feature_shape: the shape of one state, without the batch dimension.
            names: one name per group, replacing the default names (for ``"features"``: the feature names).

        Returns:
            The groups.

        Raises:
            TypeError: ``groups`` is none of the accepted forms, a mask is not integer (or bool inside a dict), an index
                is not an int.
            ValueError: a mask of the wrong shape, a negative id, an index out of range, an empty group, a feature in
                two groups, ``"channels"`` on a state without a channel dimension, or ``names`` of the wrong length,
                blank or repeated.

        Example::

            >>> FeatureGroups.resolve({"cart": [0, 1], "pole": [2, 3]}, (4,)).sizes.tolist()
            [2, 2]
        """
        shape = _feature_shape(feature_shape)
        names = None if names is None else check_names(names, "names")
        if isinstance(groups, FeatureGroups):
            if groups.feature_shape != shape:
                raise ValueError(f"groups were built for feature shape {groups.feature_shape}, the states have {shape}")
            return groups if names is None else cls(groups.ids, names, shape)
        if isinstance(groups, str):
            if groups == "features":
                return cls.features(shape, names)
            if groups == "channels":
                built = cls.channels(shape)
                return built if names is None else cls(built.ids, names, shape)
            raise ValueError(f"groups must be 'features', 'channels', an integer mask or a dict, got {shown(groups)}")
        if isinstance(groups, (Tensor, np.ndarray)):
            return cls._from_mask(groups, shape, names)
        if isinstance(groups, Mapping):
            return cls._from_dict(groups, shape, names)
        raise TypeError(
            "groups must be 'features', 'channels', an integer mask of the feature shape (a tensor or array) or a "
            f"dict {{name: indices or bool mask}}, got {type(groups).__name__}"
        )

    @classmethod
    def features(cls, feature_shape: Sequence[int], names: Sequence[str] | None = None) -> FeatureGroups:
        """One group per feature, named by ``names`` (default ``x0, x1, ...``)."""
        shape = _feature_shape(feature_shape)
        named = default_feature_names(shape) if names is None else names
        return cls(torch.arange(math.prod(shape)), named, shape, generated_names=names is None)

    @classmethod
    def channels(cls, feature_shape: Sequence[int]) -> FeatureGroups:
        """One group per index of dim 0 (``channel 0``, ...) of a ``(C, H, W)`` or ``(C, L)`` state.

        Raises:
            ValueError: the state has a single dimension (no channels).
        """
        shape = _feature_shape(feature_shape)
        if len(shape) < 2:
            raise ValueError(
                f"feature_groups='channels' needs states with a channel dimension, (C, H, W) or (C, L); the states "
                f"have feature shape {shape}: use 'features', a mask or a dict"
            )
        ids = torch.arange(shape[0]).repeat_interleave(math.prod(shape[1:]))
        return cls(ids, [f"channel {c}" for c in range(shape[0])], shape, generated_names=True)

    @classmethod
    def blocks(cls, feature_shape: Sequence[int], size: int, names: Sequence[str] | None = None) -> FeatureGroups:
        """Consecutive blocks of ``size`` flattened features (the last one may be shorter).

        A block is named after its first and last feature, ``x0..x7``.
        """
        shape, size = _feature_shape(feature_shape), check_positive_int(size, "size")
        count = math.prod(shape)
        feature_names = default_feature_names(shape) if names is None else check_feature_names(names, count, "names")
        ids, starts = torch.arange(count) // size, range(0, count, size)
        labels = [
            feature_names[start]
            if min(start + size, count) - start == 1
            else f"{feature_names[start]}..{feature_names[min(start + size, count) - 1]}"
            for start in starts
        ]
        return cls(ids, labels, shape, generated_names=names is None)

    @classmethod
    def _from_mask(
        cls, mask: Tensor | np.ndarray, shape: tuple[int, ...], names: Sequence[str] | None
    ) -> FeatureGroups:
        tensor = torch.as_tensor(mask).detach().cpu()
        if tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex():
            raise TypeError(
                f"a feature_groups mask must hold integer group ids, got dtype {tensor.dtype}; for one group of "
                "selected features pass a dict {name: bool mask}"
            )
        ids = _broadcast(tensor.to(torch.int64), shape, "the feature_groups mask").reshape(-1)  # uint16+ has no min
        if ids.numel() and int(ids.min()) < 0:
            raise ValueError(f"feature_groups mask ids must be >= 0, got {int(ids.min())}; number the groups 0, 1, ...")
        present, ids = torch.unique(ids, sorted=True, return_inverse=True)  # renumber: ids need not be contiguous
        named = [f"group {int(value)}" for value in present] if names is None else names
        return cls(ids, named, shape, generated_names=names is None)

    @classmethod
    def _from_dict(
        cls, groups: Mapping[Any, Any], shape: tuple[int, ...], names: Sequence[str] | None
    ) -> FeatureGroups:
        ids = torch.full((math.prod(shape),), -1, dtype=torch.int64)
        labels: list[str] = []
        for index, (name, members) in enumerate(groups.items()):
            if not isinstance(name, str):
                raise TypeError(f"feature_groups names must be strings, got {name!r} ({type(name).__name__})")
            flat = _members(members, shape, name)
            if flat.numel() == 0:
                raise ValueError(f"feature_groups[{name!r}] is empty; every group needs at least one feature")
            if bool((taken := ids[flat] >= 0).any()):
                feature = int(flat[taken][0])
                raise ValueError(
                    f"feature {feature} is in feature_groups[{name!r}] and in "
                    f"feature_groups[{labels[int(ids[feature])]!r}]; a feature belongs to one group"
                )
            ids[flat] = index
            labels.append(name)
        if not labels:
            raise ValueError("feature_groups is an empty dict; name at least one group")
        if bool((rest := ids < 0).any()):  # features in no group: one more group, so that the groups still add up
            ids[rest] = len(labels)
            tails = ("", " features", *(f" {number}" for number in range(2, len(labels) + 3)))
            labels.append(next(_OTHER + tail for tail in tails if _OTHER + tail not in labels))
        return cls(ids, labels if names is None else names, shape)

    # ------------------------------------------------------------------ using

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        shown = ", ".join(self.names[:4]) + (", ..." if len(self.names) > 4 else "")
        return f"FeatureGroups({len(self)} groups [{shown}] of feature shape {self.feature_shape})"

    def channel_names(self) -> list[str] | None:
        """The group names, one per channel, when the groups are exactly the channels (dim 0) in order; else ``None``.

        Pictures with one tile per channel label their tiles with these (``paddle``, ``ball``, ...). States of more
        dimensions have none: the pictures fold their leading dimensions into channels (``(T, C, H, W)``: ``T * C``).
        """
        if len(self.feature_shape) not in (2, 3) or len(self) != self.feature_shape[0]:
            return None
        channel_of_feature = torch.arange(self.feature_shape[0]).repeat_interleave(self.ids.numel() // len(self))
        return list(self.names) if torch.equal(self.ids, channel_of_feature) else None

    def members(self, group: int) -> Tensor:
        """Flat indices ``(sizes[group],)`` of the features of group ``group``, in feature order."""
        group = check_int(group, "group", minimum=0, maximum=len(self) - 1)
        start = int(self.sizes[:group].sum())
        return self._order[start : start + int(self.sizes[group])]

    def sum(self, attributions: Tensor) -> Tensor:
        """Group attributions: the sum of each group's members, per state.

        Args:
            attributions: ``(B, *feature_shape)`` (or ``(B, F)``), on any device.

        Returns:
            ``(B, G)`` in the attributions' dtype promoted to at least float32, on their device. Deterministic (no
            atomics): the same input gives bit-identical sums.

        Raises:
            TypeError: the attributions are not a tensor.
            ValueError: the attributions do not have this feature shape.
        """
        count = self.ids.numel()
        if not isinstance(attributions, Tensor):
            kind = type(attributions).__name__
            raise TypeError(f"attributions must be a torch.Tensor (B, *feature_shape), got {kind}")
        if attributions.ndim < 1 or tuple(attributions.shape[1:]) not in (tuple(self.feature_shape), (count,)):
            raise ValueError(
                f"attributions of shape {tuple(attributions.shape)} do not match the groups' feature shape "
                f"{self.feature_shape} (B, *feature_shape)"
            )
        dtype = torch.promote_types(attributions.dtype, torch.float32)
        flat = attributions.reshape(attributions.shape[0], count).to(dtype)  # (B, F)
        rows = flat.shape[0]
        if self._block is not None or not rows:  # segment_reduce refuses an empty batch
            return flat.reshape(rows, len(self), self._block or 0).sum(dim=2)  # (B, G)
        if (cached := self._device_cache.get(flat.device)) is None:  # the order and the sizes on this device, once
            cached = self._device_cache[flat.device] = (self._order.to(flat.device), self.sizes.to(flat.device))
        order, sizes = cached
        ordered = flat.index_select(1, order)  # (B, F): group 0's members, then group 1's, ...
        return torch.segment_reduce(ordered, "sum", lengths=sizes.expand(rows, len(self)), axis=1)  # (B, G)


GroupSpec = FeatureGroups | str | Tensor | np.ndarray | Mapping[str, Any]  # the class, not its name: resolvable
"""What :meth:`FeatureGroups.resolve` accepts."""


def _broadcast(tensor: Tensor, shape: tuple[int, ...], what: str) -> Tensor:
    """``tensor`` broadcast to ``shape``; a leading batch dimension of 1 (Captum's layout) is dropped."""
    if tensor.ndim == len(shape) + 1 and tensor.shape[0] == 1:
        tensor = tensor[0]
    try:
        return torch.broadcast_to(tensor, shape)
    except RuntimeError:
        raise ValueError(
            f"{what} has shape {tuple(tensor.shape)}, which does not fit the feature shape {shape}; "
            f"give it shape {shape} (or one that broadcasts to it)"
        ) from None


def _members(members: Any, shape: tuple[int, ...], name: str) -> Tensor:
    """Flat feature indices of one dict entry: an index list or a bool mask."""
    count = math.prod(shape)
    if isinstance(members, (Tensor, np.ndarray)) and torch.as_tensor(members).dtype == torch.bool:
        mask = _broadcast(torch.as_tensor(members).cpu(), shape, f"feature_groups[{name!r}]")
        return torch.nonzero(mask.reshape(-1)).reshape(-1)
    indices = None
    if not isinstance(members, (str, bytes)):
        try:
            indices = torch.as_tensor(members).reshape(-1)
        except (OverflowError, ValueError, TypeError, RuntimeError) as error:  # else not numbers at all: said below
            if isinstance(error, OverflowError) or "Overflow" in str(error):  # an int past int64: no such feature
                raise ValueError(  # (torch says so with a ValueError, with a RuntimeError up to torch 2.8)
                    f"feature_groups[{name!r}] holds an index outside the {count} features of shape {shape} "
                    f"({shown(members, 80)}; flat indices, 0-based)"
                ) from None
    if indices is None or (indices.numel() and (indices.is_floating_point() or indices.dtype == torch.bool)):
        raise TypeError(
            f"feature_groups[{name!r}] must be a list of flat feature indices or a bool mask of the feature shape, a "
            f"tensor or array (torch.tensor of a list of bools), got {members!r:.80}"
        )
    indices = indices.to(torch.int64)
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= count):
        bad = int(indices[(indices < 0) | (indices >= count)][0])
        raise ValueError(
            f"feature_groups[{name!r}] holds index {bad}, outside the {count} features of shape {shape} "
            "(flat indices, 0-based)"
        )
    if torch.unique(indices).numel() != indices.numel():
        raise ValueError(f"feature_groups[{name!r}] lists a feature twice")
    return indices


def _feature_shape(feature_shape: Any) -> tuple[int, ...]:
    return tuple(check_int_sequence(feature_shape, "feature_shape", minimum=1))


def _group_names(names: Any, count: int, what: str, groups: Sequence[str] = ()) -> list[str]:
    """One printable, distinct name per group; more or fewer names than groups is a mistake, not a padding (the
    message lists the ``groups`` as named now: a dict's features in no group are one more, ``other``)."""
    listed = check_names(names, what)
    if len(listed) != count:
        now = f" {shown(list(groups), 80)}" if groups else ""
        raise ValueError(
            f"{what} has {len(listed)} names but there are {count} groups{now}; pass one name per group "
            f"(got {shown(listed, 80)})"
        )
    return listed


def check_group_spec(groups: Any, name: str = "feature_groups") -> Any:
    """``groups`` if it is ``None`` or a form :meth:`FeatureGroups.resolve` takes (its shape is checked there)."""
    if groups is None or isinstance(groups, (FeatureGroups, Tensor, np.ndarray, Mapping)):
        return groups
    if isinstance(groups, str) and groups in ("features", "channels"):
        return groups
    raise (ValueError if isinstance(groups, str) else TypeError)(
        f"{name} must be None, 'features', 'channels', an integer mask of the feature shape (a tensor or array: "
        f"torch.tensor of a list) or a dict {{name: indices or bool mask}}, got {shown(groups)}"
    )
