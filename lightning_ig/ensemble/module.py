"""An ensemble of models as one attribution target: :class:`Ensemble`, registered as ``"Ensemble"`` so that a
checkpoint rebuilds it (members, weights and all) without the user's code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from typing_extensions import TypeIs

from lightning_ig.attribution.checks import check_generator
from lightning_ig.ensemble.reduce import EnsembleReduce, member_means
from lightning_ig.models.registry import build_model, model_config, model_name, register_model
from lightning_ig.vocabulary import BackendName

__all__ = ["Ensemble", "is_ensemble"]


@register_model("Ensemble")
class Ensemble(nn.Module):
    """A weighted ensemble whose forward is the aggregate ``sum_m w_m mean_k sigmoid(member_m(x))``.

    Members are any modules mapping ``(N, *feature_shape)`` to ``(N, K)`` with one
    ``K`` for all (e.g. :class:`~lightning_ig.models.DuelingQNetwork`, whose
    output is ``(N, num_actions)``). The forward stacks their outputs to
    ``(N, M, K)`` and reduces them with the fused kernel on CUDA (its torch twin
    elsewhere). The weights are a float32 buffer ``reduce.weights``, checked for
    NaN/Inf when set and after ``load_state_dict``.

    Args:
        members: the member modules, or ``{"name": ..., "config": ...}`` dicts
            that :func:`~lightning_ig.models.build_model` builds (what ``config()``
            writes, so a checkpoint rebuilds the ensemble). At least one. A name is a
            registered architecture or an import path; when the ensemble is built from
            a checkpoint's metadata an import path is refused (nothing imported) unless
            the reader trusts the file (``trust_remote_code``).
        weights: one weight per member; ``None`` (default) averages them (``1 / M`` each).
        backend: ``"auto"`` (default), ``"cuda"`` or ``"torch"``; see
            :func:`~lightning_ig.ensemble.ensemble_reduce`.

    Raises:
        TypeError: a member that is neither a module nor a ``{"name", "config"}`` dict.
        ValueError: no members, a member dict that does not build, members of different dtypes, weights of the
            wrong length or holding NaN/Inf, or an unknown backend.
        UnregisteredModelError: a member named by an import path where imports are refused
            (see :func:`~lightning_ig.models.build_model`); a ``ValueError`` too.

    Example::

        >>> from lightning_ig.models import DuelingQNetwork
        >>> heads = [DuelingQNetwork(4, 2, hidden_sizes=(16,), noisy=False) for _ in range(3)]
        >>> ensemble = Ensemble(heads, weights=[0.5, 0.25, 0.25])
        >>> ensemble(torch.zeros(5, 4)).shape, ensemble.member_signals(torch.zeros(5, 4)).shape
        (torch.Size([5]), torch.Size([5, 3]))
        >>> rebuilt = build_model("Ensemble", ensemble.config())
        >>> rebuilt.num_members, rebuilt.weights.tolist()
        (3, [0.5, 0.25, 0.25])
    """

    def __init__(
        self,
        members: Sequence[nn.Module | Mapping[str, Any]],
        weights: Sequence[float] | Tensor | None = None,
        *,
        backend: BackendName = "auto",
    ) -> None:
        super().__init__()
        if isinstance(members, nn.ModuleList):
            members = list(members)
        if isinstance(members, (nn.Module, str, bytes, Mapping)) or not isinstance(members, Sequence):
            raise TypeError(
                f"members must be a list of modules (or of {{'name', 'config'}} dicts), got {type(members).__name__}"
            )
        if len(members) == 0:
            raise ValueError("members is empty; an Ensemble needs at least one member")
        self.members = nn.ModuleList(_build_member(index, member) for index, member in enumerate(members))
        _check_one_dtype(self.members)
        count = len(self.members)
        self.reduce = EnsembleReduce(count if weights is None else weights, backend=backend)
        if self.reduce.num_members != count:
            raise ValueError(
                f"weights has {self.reduce.num_members} entries for {count} members; pass one weight per member"
            )

    @property
    def num_members(self) -> int:
        """``M``, the number of members."""
        return len(self.members)

    @property
    def weights(self) -> Tensor:
        """The members' weights ``(M,)`` (float32, on the ensemble's device)."""
        return self.reduce.weights

    def member_logits(self, x: Tensor) -> Tensor:
        """Every member's output, stacked: ``(N, *feature_shape) -> (N, M, K)``.

        Raises:
            ValueError: a member's output is not ``(N, K)`` or its ``K`` differs from member 0's.
        """
        outputs = [member(x) for member in self.members]
        first = outputs[0]
        for index, output in enumerate(outputs):
            if not isinstance(output, Tensor) or output.dim() != 2 or output.shape != (x.shape[0], *first.shape[1:]):
                shape = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
                raise ValueError(
                    f"member {index} ({type(self.members[index]).__name__}) returned {shape} for {x.shape[0]} states; "
                    f"every member must return (N, K) with one K for all (member 0 returned {tuple(first.shape)})"
                )
        return torch.stack(outputs, dim=1)  # (N, M, K)

    def forward(self, x: Tensor) -> Tensor:
        """The aggregate signal ``(N,)``: the fused reduce of :meth:`member_logits`."""
        return self.reduce(self.member_logits(x))

    def member_signals(self, x: Tensor) -> Tensor:
        """Each member's own signal ``mean_k sigmoid(member_m(x))``: ``(N, M)``.

        ``forward(x) == member_signals(x) @ weights`` up to rounding. Attribute every
        member in one IG run with ``integrated_gradients(ensemble.member_signals,
        states, target="each")`` (attributions ``(M, B, *feature_shape)``).
        """
        return member_means(self.member_logits(x))

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """Draw new noise in every member that has ``reset_noise`` (NoisyNet members)."""
        check_generator(generator)  # here too when no member is noisy: a wrong argument is wrong either way
        for member in self.members:
            reset = getattr(member, "reset_noise", None)
            if callable(reset):
                reset(generator)

    def config(self) -> dict[str, Any]:
        """JSON-serialisable constructor arguments: ``build_model("Ensemble", e.config())`` rebuilds it.

        Members are recorded as ``{"name": model_name(member), "config": model_config(member)}``.
        """
        return {
            "members": [{"name": model_name(member), "config": model_config(member)} for member in self.members],
            "weights": [float(w) for w in self.reduce.weights.detach().cpu().tolist()],
            "backend": self.reduce.backend,
        }

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}"


class _EnsembleLike(Protocol):
    @property
    def num_members(self) -> int: ...

    def member_signals(self, x: Tensor) -> Tensor: ...


def is_ensemble(model: Any) -> TypeIs[_EnsembleLike]:
    """Whether ``model`` can be attributed per member: it has ``member_signals`` and ``num_members``.

    True for :class:`Ensemble` and for any module that offers the same two names
    (``member_signals(x) -> (N, M)``), which is what the callback and the command
    line look for.
    """
    return callable(getattr(model, "member_signals", None)) and isinstance(getattr(model, "num_members", None), int)


def _build_member(index: int, member: nn.Module | Mapping[str, Any]) -> nn.Module:
    if isinstance(member, nn.Module):
        return member
    if isinstance(member, Mapping):
        name, config = member.get("name"), member.get("config")
        if not isinstance(name, str) or not isinstance(config, (dict, type(None))) or set(member) - {"name", "config"}:
            raise ValueError(
                f"members[{index}] must be {{'name': <architecture>, 'config': <dict or None>}}, got "
                f"{dict(member)!r:.120}"
            )
        return build_model(name, config)
    raise TypeError(
        f"members[{index}] must be an nn.Module or a {{'name', 'config'}} dict, got {type(member).__name__}"
    )


def _check_one_dtype(members: nn.ModuleList) -> None:
    """Members whose floating parameters differ in dtype cannot take one batch: say so now, not at the first call."""
    dtypes = [next((p.dtype for p in member.parameters() if p.is_floating_point()), None) for member in members]
    found = {dtype for dtype in dtypes if dtype is not None}
    if len(found) > 1:
        listed = ", ".join(f"member {index}: {dtype}" for index, dtype in enumerate(dtypes) if dtype is not None)
        raise ValueError(
            f"the members' parameters have different dtypes ({listed}); an ensemble runs one batch through every "
            "member: convert them to one dtype first (e.g. member.to(torch.float32))"
        )
