"""One attribution along the path: chunks of rows per forward, their defaults and the out-of-memory retry."""

from __future__ import annotations

import pytest
import torch

from lightning_ig.attribution import integrated_gradients
from lightning_ig.attribution.path import CPU_CHUNK_ROWS, check_run_memory
from tests.support.models import seeded_mlp
from tests.support.tolerance import assert_close_scaled

F64 = torch.float64


@pytest.mark.parametrize("gradient", ["autograd", "finite_difference"])
@pytest.mark.parametrize("chunk", [1, 7, 33])
def test_chunked_equals_unchunked(gradient: str, chunk: int) -> None:
    model = seeded_mlp(4, 2, seed=10)
    x = torch.randn(3, 4, dtype=torch.float64)
    whole = integrated_gradients(model, x, target="each", gradient=gradient, n_steps=6)
    chunked = integrated_gradients(model, x, target="each", gradient=gradient, n_steps=6, internal_batch_size=chunk)
    # GEMMs may block rows differently: a few roundings of the forward and its gradient.
    assert_close_scaled(chunked.attributions, whole.attributions, ulps=16, dtype=F64)
    assert_close_scaled(chunked.f_input, whole.f_input, ulps=16, dtype=F64)
    if gradient == "autograd":
        assert chunked.internal_batch_size == chunk
    else:  # whole path points: 2 F = 8 probe rows each
        assert chunked.internal_batch_size == max(8, chunk // 8 * 8)


def test_out_of_memory_halves_the_chunk_and_retries_with_a_warning() -> None:
    model = seeded_mlp(4, 1, seed=11)
    x = torch.randn(4, 4, dtype=torch.float64)
    largest = []

    def forward(z: torch.Tensor) -> torch.Tensor:
        if z.shape[0] > 10:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        largest.append(z.shape[0])
        return model(z).squeeze(1)

    with pytest.warns(RuntimeWarning, match="ran out of memory"):
        result = integrated_gradients(forward, x, n_steps=8, internal_batch_size=40)
    reference = integrated_gradients(lambda z: model(z).squeeze(1), x, n_steps=8)
    assert_close_scaled(result.attributions, reference.attributions, ulps=16, dtype=F64)
    assert max(largest) <= 10 and result.internal_batch_size == 10


def test_default_chunk_holds_small_work_in_one_forward() -> None:
    rows: list[int] = []
    weight = torch.randn(5, dtype=torch.float64)

    def forward(z: torch.Tensor) -> torch.Tensor:
        rows.append(z.shape[0])
        return z @ weight

    x = torch.randn(4, 5, dtype=torch.float64)
    result = integrated_gradients(forward, x, n_steps=10, method="riemann_middle")
    # The path and both ends, twice (the stochastic-forward check), in one forward.
    assert rows == [(10 + 4) * 4] and result.internal_batch_size == (10 + 4) * 4
    rows.clear()
    integrated_gradients(forward, x, n_steps=10, gradient="finite_difference")
    assert rows == [10 * 4 * 2 * 5 + 4 * 4]  # every probe and both ends, twice, in one forward


def test_on_the_cpu_the_default_chunk_is_at_most_a_thousand_rows() -> None:
    rows: list[int] = []
    model = seeded_mlp(5, 1, seed=45, act=torch.nn.ReLU)

    def forward(z: torch.Tensor) -> torch.Tensor:
        rows.append(z.shape[0])
        return model(z).squeeze(1)

    x = torch.randn(40, 5, dtype=torch.float64)
    first = integrated_gradients(forward, x, n_steps=64, method="riemann_middle")
    assert first.internal_batch_size == CPU_CHUNK_ROWS and max(rows) == CPU_CHUNK_ROWS
    assert sum(rows) == (64 + 4) * 40
    again = integrated_gradients(forward, x, n_steps=64, method="riemann_middle")
    assert torch.equal(first.attributions, again.attributions)


@pytest.mark.parametrize(("states", "features", "target_rows"), [(256, 4, 1), (256, 4, 2), (64, 400, 1), (64, 1000, 1)])
def test_the_examples_default_held_out_states_fit_in_a_gibibyte(
    monkeypatch: pytest.MonkeyPatch, states: int, features: int, target_rows: int
) -> None:
    from lightning_ig import vocabulary

    # CartPole's 256 states ("mean" and "each"), MinAtar's 64 frames (breakout's 4 channels, seaquest's 10) as "mean":
    # measured peaks over the process at set-up 16-23 MB, 79-143 MB (400 features); every state refined still fits
    monkeypatch.setattr(vocabulary, "available_memory", lambda: 2**30)
    check_run_memory(states * target_rows, features, "auto", "IG", "fix", 512)
    with pytest.raises(
        ValueError, match=r"^IG needs about .* more than the 1\.0 GiB available here \(swap not counted: .*\); fix$"
    ):
        check_run_memory(states * target_rows * 64, features, "auto", "IG", "fix", 512)  # the check can fail
