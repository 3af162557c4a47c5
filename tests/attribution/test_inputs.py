"""What a call is given: the baseline forms, and inputs, baselines and forwards refused with one clear error."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from lightning_ig.attribution import StochasticForwardWarning, integrated_gradients
from lightning_ig.attribution.inputs import module_of
from tests.support.models import seeded_mlp

F64 = torch.float64


@pytest.mark.parametrize("form", ["none", "zeros", "mean", "scalar", "single", "per_state"])
def test_every_baseline_form(form: str) -> None:
    model = seeded_mlp(3, 1, seed=7)
    forward = lambda z: model(z).squeeze(1)  # noqa: E731
    x = torch.randn(4, 3, dtype=torch.float64)
    single = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    per_state = torch.randn(4, 3, dtype=torch.float64)
    given, explicit = {
        "none": (None, torch.zeros_like(x)),
        "zeros": ("zeros", torch.zeros_like(x)),
        "mean": ("mean", x.mean(0, keepdim=True).expand_as(x)),
        "scalar": (0.25, torch.full_like(x, 0.25)),
        "single": (single, single.expand_as(x)),
        "per_state": (per_state, per_state),
    }[form]
    result = integrated_gradients(forward, x, given, n_steps=6)
    reference = integrated_gradients(forward, x, explicit.clone(), n_steps=6)
    torch.testing.assert_close(result.attributions, reference.attributions, rtol=0, atol=0)
    torch.testing.assert_close(result.baselines, explicit)


def _forward(z: torch.Tensor) -> torch.Tensor:
    return z.reshape(z.shape[0], -1).sum(1)


def test_error_baseline_shape_mismatch() -> None:
    with pytest.raises(ValueError, match=r"baselines of shape \(5,\) do not match inputs of shape \(2, 3\)"):
        integrated_gradients(_forward, torch.randn(2, 3), torch.randn(5))


def test_error_non_floating_inputs_and_baselines() -> None:
    with pytest.raises(TypeError, match="inputs must be floating point.*got torch.int64.*inputs.float"):
        integrated_gradients(_forward, torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="baselines must be floating point"):
        integrated_gradients(_forward, torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(TypeError, match="inputs must be a torch.Tensor"):
        integrated_gradients(_forward, [[1.0, 2.0]])


def test_error_inputs_without_states_or_features_advise_the_state_dimension_only_where_it_is_missing() -> None:
    for shape in ((), (0, 3), (4, 0)):
        with pytest.raises(ValueError, match=r"inputs must have shape \(num_states >= 1") as error:
            integrated_gradients(_forward, torch.zeros(shape))
        assert ("unsqueeze" in str(error.value)) == (shape == ()), str(error.value)


def test_error_sparse_or_meta_inputs_and_baselines_say_what_to_pass() -> None:
    x = torch.randn(2, 3)
    for inputs, baselines, what in [
        (x.to_sparse(), None, "inputs is a torch.sparse_coo tensor"),
        (x.to("meta"), None, "inputs is on the meta device"),
        (x, torch.zeros(2, 3).to_sparse(), "baselines is a torch.sparse_coo tensor"),
        (x, torch.zeros(3, device="meta"), "baselines is on the meta device"),
    ]:
        with pytest.raises(ValueError, match=what + ".*pass a dense tensor with values"):
            integrated_gradients(_forward, inputs, baselines)


def test_error_nan_and_inf_name_the_count_and_first_index() -> None:
    x = torch.randn(3, 4)
    x[1, 2] = float("nan")
    x[2, 0] = float("inf")
    with pytest.raises(ValueError, match=r"inputs holds 2 NaN/Inf value\(s\), the first at index \(1, 2\)"):
        integrated_gradients(_forward, x)
    b = torch.zeros(3, 4)
    b[0, 3] = float("-inf")
    with pytest.raises(ValueError, match=r"baselines holds 1 NaN/Inf value\(s\), the first at index \(0, 3\)"):
        integrated_gradients(_forward, torch.randn(3, 4), b)
    with pytest.raises(ValueError, match="baselines must be a finite number"):
        integrated_gradients(_forward, torch.randn(3, 4), float("nan"))
    # guards against: torch's "value cannot be converted to type float without overflow", a bug's exit status on the
    # command line
    with pytest.raises(ValueError, match=r"baselines must be a finite number of the inputs' dtype torch.float32"):
        integrated_gradients(_forward, torch.randn(3, 4), 1e308)
    with pytest.raises(ValueError, match="baselines must be a finite number"):
        integrated_gradients(_forward, torch.randn(3, 4), 10**400)


def test_error_a_baseline_tensor_past_the_inputs_dtype_range() -> None:
    """A finite float32 baseline past float16's range is inf once cast to float16 inputs' dtype: refused as the
    number form is (it used to be checked before the cast, and the call returned NaN attributions without a word)."""
    baseline = torch.tensor([0.0, 1e5, 0.0])
    with pytest.raises(
        ValueError, match=r"baselines as torch.float16 holds 1 NaN/Inf value\(s\), the first at index \(1,\)"
    ):
        integrated_gradients(_forward, torch.randn(4, 3, dtype=torch.float16), baseline, n_steps=4)
    with pytest.raises(ValueError, match=r"baselines as torch.float32 holds 3 NaN/Inf"):
        integrated_gradients(_forward, torch.randn(4, 3), torch.full((3,), 1e39, dtype=F64), n_steps=4)
    result = integrated_gradients(_forward, torch.randn(4, 3, dtype=torch.float16), baseline / 2, n_steps=4)
    assert not bool(result.non_finite.any())  # 5e4 is a float16


def test_error_forward_returning_the_wrong_shape() -> None:
    with pytest.raises(
        ValueError,
        match=r"forward must return one value per row: shape \(\d+,\).*rows it was given.*got \(\d+, 3\).*target=",
    ):
        integrated_gradients(lambda z: z, torch.randn(2, 3))
    with pytest.raises(ValueError, match=r"with target='mean' forward must return \(N, A\)"):
        integrated_gradients(lambda z: z.unsqueeze(1), torch.randn(2, 3), target="mean")  # (N, 1, A)
    with pytest.raises(TypeError, match=r"got tuple; pick one, e.g. forward=lambda x: model\(x\)\[0\]"):
        integrated_gradients(lambda z: (z.sum(1), None), torch.randn(2, 3))
    with pytest.raises(TypeError, match="forward must return a torch.Tensor, got list"):
        integrated_gradients(lambda z: [0.0], torch.randn(2, 3))
    with pytest.raises(ValueError, match="target=5 is out of range for a forward with 3 outputs"):
        integrated_gradients(lambda z: z, torch.randn(2, 3), target=5)
    with pytest.raises(ValueError, match="target holds index 3, out of range"):
        integrated_gradients(lambda z: z, torch.randn(2, 3), target=torch.tensor([0, 3]))


_GLOBAL_NET = torch.nn.Linear(3, 1)  # a module a lambda names as a global


def _apply(net: torch.nn.Module, z: torch.Tensor) -> torch.Tensor:
    return net(z).squeeze(1)


def test_module_of_finds_the_module_behind_a_lambda_a_global_or_a_partial() -> None:
    """module_of sees through a lambda's closure, the globals a lambda names and a functools.partial's arguments
    (it used to find only a module, a bound method's owner or a wrapper's __wrapped__)."""
    model = seeded_mlp(3, 1, seed=8)
    assert module_of(lambda z: model(z).squeeze(1)) is model
    assert module_of(lambda z: _GLOBAL_NET(z).squeeze(1)) is _GLOBAL_NET
    assert module_of(functools.partial(_apply, model)) is model
    assert module_of(lambda z: z.sum(1)) is None
    assert module_of(lambda z, net=model: net(z).squeeze(1)) is model  # a default, as loops bind their model
    assert module_of(lambda z, *, net=model: net(z).squeeze(1)) is model
    nets = {"q": model}
    assert module_of(lambda z: nets["q"](z).squeeze(1)) is model  # a dict it closes over

    class Policy:  # an agent's callable object that is not a module
        def __init__(self) -> None:
            self.net = model

        def __call__(self, z: torch.Tensor) -> torch.Tensor:
            return self.net(z).squeeze(1)

    assert module_of(Policy()) is model


def _norm_state(norm: torch.nn.Module) -> list[torch.Tensor]:
    return [norm.running_mean.clone(), norm.running_var.clone(), norm.num_batches_tracked.clone()]


def test_batch_norm_behind_a_lambda_keeps_its_statistics_and_flags_the_run() -> None:
    """Batch-norm in train mode behind a lambda: the running statistics are put back after the call and the result
    is flagged stochastic, the warning naming the layer (a lambda's modules used to go unseen: the statistics
    moved)."""
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = model.double().train()
    model(torch.randn(5, 3, dtype=F64))  # statistics that are not the initial ones
    before = _norm_state(model[1])
    with pytest.warns(StochasticForwardWarning, match="BatchNorm1d in train mode"):
        result = integrated_gradients(lambda z: model(z).squeeze(1), torch.randn(4, 3, dtype=F64), n_steps=4)
    assert result.stochastic
    for kept, now in zip(before, _norm_state(model[1])):
        assert torch.equal(kept, now)
    assert model.training


class _Agent:  # an RL agent that is not a module: its network is an attribute
    def __init__(self, net: torch.nn.Module) -> None:
        self.net = net

    def q(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).squeeze(1)


_AGENT = _Agent(torch.nn.Linear(3, 1))  # a global a lambda names


def test_batch_norm_behind_an_agents_method_or_attribute_keeps_its_statistics_and_flags_the_run() -> None:
    """``forward=agent.q`` (a bound method of an object that is not a module) and ``lambda z: agent.net(z)``: the
    batch-norm layer in train mode is found, its running statistics are put back and the run is flagged (the agent's
    network went unseen: the statistics moved and the batch-dependent attributions passed as deterministic)."""
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = model.double().train()
    model(torch.randn(5, 3, dtype=F64))  # statistics that are not the initial ones
    agent = _Agent(model)
    _AGENT.net = model
    for forward in (agent.q, lambda z: _AGENT.net(z).squeeze(1)):
        before = _norm_state(model[1])
        with pytest.warns(StochasticForwardWarning, match="BatchNorm1d in train mode"):
            result = integrated_gradients(forward, torch.randn(4, 3, dtype=F64), n_steps=4)
        assert result.stochastic
        for kept, now in zip(before, _norm_state(model[1])):
            assert torch.equal(kept, now)
    assert module_of(agent.q) is model


def test_batch_norm_of_a_scripted_or_traced_model_keeps_its_statistics_and_flags_the_run() -> None:
    """``torch.jit.script`` / ``torch.jit.trace`` of a model with batch-norm in train mode: its layers are script
    modules, not ``BatchNorm1d`` instances, and went unseen (the statistics moved, the run passed as deterministic)."""
    torch.manual_seed(12)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = model.double().train()
    model(torch.randn(5, 3, dtype=F64))  # statistics that are not the initial ones
    rows = torch.randn(4, 3, dtype=F64)
    for compiled in (torch.jit.script(model), torch.jit.trace(model, rows)):
        compiled.train()
        before = [buffer.clone() for buffer in compiled.buffers()]
        with pytest.warns(StochasticForwardWarning):
            result = integrated_gradients(compiled, rows, target=0, n_steps=4)
        assert result.stochastic
        for kept, now in zip(before, compiled.buffers()):
            assert torch.equal(kept, now)


def test_an_agents_target_network_with_noise_on_is_not_blamed_for_a_forward_that_never_calls_it() -> None:
    """``forward=agent.q`` on an agent whose online network has its noise off and whose target network (an attribute
    the forward never calls) has it on: no "noise on" warning naming the target network's layers."""
    from lightning_ig.models import DuelingQNetwork, noise_disabled

    torch.manual_seed(5)
    agent = _Agent(DuelingQNetwork(3, 2, noisy=True))
    agent.target = DuelingQNetwork(3, 2, noisy=True)  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        warnings.simplefilter("error", StochasticForwardWarning)
        with noise_disabled(agent.net):
            result = integrated_gradients(lambda z: agent.net(z).mean(1), torch.randn(4, 3), n_steps=4)
            agent_result = integrated_gradients(agent.q, torch.randn(4, 3), n_steps=4, target="mean")
    assert not result.stochastic and not agent_result.stochastic


def test_instance_norm_in_train_mode_keeps_its_running_statistics() -> None:
    """An InstanceNorm1d with track_running_stats in train mode moves its running statistics at every forward: a
    call puts them back as it does batch-norm's (they used to be left moved by the engine's forwards)."""
    torch.manual_seed(10)
    norm = torch.nn.InstanceNorm1d(2, track_running_stats=True)
    model = torch.nn.Sequential(norm, torch.nn.Flatten(), torch.nn.Linear(8, 1), torch.nn.Flatten(0))
    model = model.double().train()
    model(torch.randn(3, 2, 4, dtype=F64))  # statistics that are not the initial ones
    before = _norm_state(norm)
    result = integrated_gradients(model, torch.randn(4, 2, 4, dtype=F64), n_steps=4)
    assert not result.stochastic  # each row is normalised on its own: the same rows give the same values
    for kept, now in zip(before, _norm_state(norm)):
        assert torch.equal(kept, now)
    assert norm.training


def test_spectral_norm_in_train_mode_keeps_its_power_iteration_vectors() -> None:
    """Spectral normalisation in train mode advances its power iteration (its ``_u`` and ``_v`` buffers) at every
    forward: a call puts them back as it does batch-norm's statistics (they were left moved by the engine's
    forwards, so the model computed other values after the call)."""
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    torch.nn.utils.parametrizations.spectral_norm(model[0], n_power_iterations=1)
    old_style = torch.nn.utils.spectral_norm(model[2])  # torch's deprecated form: weight_u, weight_v on the layer
    model = model.double().train()
    before = {name: buffer.clone() for name, buffer in model.named_buffers()}
    integrated_gradients(model, torch.randn(4, 3, dtype=F64), target="mean", n_steps=8)
    assert before.keys() == dict(model.named_buffers()).keys() and old_style.training
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, before[name]), name
