"""The callback on a CUDA model with backend="cuda" (CuPy kernels, CUDA-graph replay). Needs a GPU and CuPy."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions, integrated_gradients
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.models.noise import noise_disabled
from tests.support.tiny import FEATURES, TinyQNet, dataset, held_out_states, make_trainer
from tests.support.tolerance import assert_close_scaled

pytestmark = pytest.mark.gpu


def _importable(*names: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in names)


# The GPU machine may run from the tree without the optional extras: TensorBoard checks only where it is installed.
HAS_TENSORBOARD = _importable("tensorboard", "PIL")


def _trainer(tmp_path: Path, callbacks: list, max_steps: int, **kwargs: Any) -> pl.Trainer:
    return make_trainer(tmp_path, callbacks, max_steps, accelerator="gpu", **kwargs)


def _direct(model: TinyQNet, states: torch.Tensor, device: torch.device, **options: Any):
    model = model.to(device).eval()
    with noise_disabled(model):
        return integrated_gradients(model, states.to(device), **options)


def test_cuda_backend_logs_what_the_torch_reference_computes(tmp_path, cuda_device):
    pl.seed_everything(0)
    model = TinyQNet()
    states = held_out_states(256)
    callback = IntegratedGradientsCallback(
        states,
        every_n_steps=5,
        feature_names=FEATURES,
        report_dir=tmp_path / "reports",
        engine=IGOptions(n_steps=50, backend="cuda"),
    )
    csv_logger = CSVLogger(tmp_path, name="csv")
    loggers: list[Any] = [csv_logger]
    if HAS_TENSORBOARD:
        loggers.append(TensorBoardLogger(tmp_path, name="gpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(tmp_path, [callback], max_steps=15, logger=loggers).fit(model, DataLoader(dataset(), batch_size=32))
    capture_failures = [str(w.message) for w in caught if "CUDA graph capture" in str(w.message)]
    assert not capture_failures, capture_failures
    assert [entry["global_step"] for entry in callback.history] == [5, 10, 15]
    # captured on the first run and replayed by the engine on the later ones
    run = callback._fit
    assert run is not None
    assert run.engine.last_mode == "graph"

    report = json.loads((tmp_path / "reports" / "ig_report_step=00000015.json").read_text())
    assert report["backend"] == "cuda" and report["num_states"] == 256 and report["num_steps"] == 50
    reference = _direct(model, states, cuda_device, target="mean", n_steps=50, backend="torch")
    attributions = reference.attributions.double().cpu()
    # The kernels and their torch twins differ by float32 rounding of sums over 50 steps and 4 features at most.

    scale = float(attributions.abs().sum(1).max())
    assert_close_scaled(
        [f["mean_abs"] for f in report["features"]], attributions.abs().mean(0).numpy(), ulps=1024, scale=scale
    )
    assert_close_scaled(
        [s["sum_attributions"] for s in report["completeness"]["per_state"]],
        attributions.sum(1).numpy(),
        ulps=1024,
        scale=scale,
    )
    assert report["completeness"]["worst_relative_error"] < 1e-2

    metrics = (Path(csv_logger.log_dir) / "metrics.csv").read_text()
    assert all(f"ig/mean_abs/{name}" in metrics for name in FEATURES) and "ig/time_ms" in metrics
    if not HAS_TENSORBOARD:
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(loggers[1].log_dir, size_guidance={"scalars": 0, "images": 0, "histograms": 0})
    events.Reload()
    tags = events.Tags()
    assert {f"ig/mean_abs/{name}" for name in FEATURES} <= set(tags["scalars"])
    assert {"ig/0_verdict", "ig/1_over_training"} <= set(tags["images"])
    assert {f"ig/attributions/{name}" for name in FEATURES} <= set(tags["histograms"])


def _train(tmp_path: Path, with_callback: bool) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    pl.seed_everything(5)
    model = TinyQNet()
    callbacks = (
        [
            IntegratedGradientsCallback(
                held_out_states(64), every_n_steps=3, engine=IGOptions(n_steps=16, backend="cuda")
            )
        ]
        if with_callback
        else []
    )
    trainer = _trainer(tmp_path, callbacks, max_steps=12)
    trainer.fit(model, DataLoader(dataset(), batch_size=32, shuffle=True))
    weights = {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}
    optimizer = trainer.optimizers[0].state_dict()
    state = {
        key: {name: torch.as_tensor(value).cpu().clone() for name, value in entry.items()}
        for key, entry in optimizer["state"].items()
    }
    return weights, state


def _same(a: tuple[dict, dict], b: tuple[dict, dict]) -> bool:
    weights = all(torch.equal(a[0][name], b[0][name]) for name in a[0])
    optimizer = all(torch.equal(a[1][k][n], b[1][k][n]) for k in a[1] for n in a[1][k])
    return weights and optimizer


def test_training_on_the_gpu_is_bit_identical_with_the_callback(tmp_path, cuda_device):
    first = _train(tmp_path / "a", with_callback=False)
    second = _train(tmp_path / "b", with_callback=False)
    if not _same(first, second):
        pytest.skip("training alone is not bit-reproducible on this device, so there is nothing to compare against")
    with_callback = _train(tmp_path / "c", with_callback=True)
    for name in first[0]:
        assert torch.equal(first[0][name], with_callback[0][name]), f"{name} differs with the callback"
    assert _same(first, with_callback)


def test_a_run_leaves_the_cuda_generator_and_grads_alone(tmp_path, cuda_device):
    pl.seed_everything(1)
    model = TinyQNet()
    callback = IntegratedGradientsCallback(
        held_out_states(64), every_n_steps=2, engine=IGOptions(n_steps=16, backend="cuda")
    )
    trainer = _trainer(tmp_path, [callback], max_steps=2)
    trainer.fit(model, DataLoader(dataset(), batch_size=32))
    model.to(cuda_device).train()
    # The callback caches its states on the fit's device; run it again by hand on the CUDA model.
    callback.on_fit_start(trainer, model)
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    grads = [parameter.grad.clone() for parameter in model.parameters()]
    cuda_state = torch.cuda.get_rng_state()
    cpu_state = torch.get_rng_state()
    callback._run(trainer, model, final=False)
    callback._run(trainer, model, final=False)  # the replay path too
    assert torch.equal(cuda_state, torch.cuda.get_rng_state())
    assert torch.equal(cpu_state, torch.get_rng_state())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert all(module.training for module in model.modules())
    assert callback.history[-1]["mean_abs"] == pytest.approx(
        callback.history[-2]["mean_abs"], rel=16 * float(torch.finfo(torch.float32).eps)
    )


def _atari_report(tmp_path: Path, backend: str, states: torch.Tensor) -> tuple[dict, Any]:
    from tests.support.tiny import NatureDuelingQNet

    torch.manual_seed(0)
    model = NatureDuelingQNet()
    model.configure_optimizers = lambda: torch.optim.SGD(model.parameters(), lr=0.0)  # the same weights for both paths
    callback = IntegratedGradientsCallback(
        states, every_n_steps=1, report_dir=tmp_path / "r", engine=IGOptions(backend=backend)
    )
    loggers: list[Any] = [TensorBoardLogger(tmp_path, name="tb")] if HAS_TENSORBOARD else []
    data = DataLoader(torch.utils.data.TensorDataset(states[:8], torch.zeros(8)), batch_size=8)
    _trainer(tmp_path, [callback], max_steps=2, logger=loggers or False).fit(model, data)
    report = json.loads((tmp_path / "r" / "ig_report_step=00000002.json").read_text())
    return report, (loggers[0] if loggers else None)


def test_atari_states_under_cuda_equal_the_torch_path(tmp_path, cuda_device):
    from tests.support.tiny import frames

    states = frames(32, (4, 84, 84))
    cuda, cuda_logger = _atari_report(tmp_path / "cuda", "cuda", states)
    torch_path, _ = _atari_report(tmp_path / "torch", "torch", states)
    assert cuda["backend"] == "cuda" and torch_path["backend"] == "torch"
    assert [g["name"] for g in cuda["groups"]] == [f"channel {c}" for c in range(4)]
    scale = max(
        abs(s["sum_attributions"]) + abs(s["f_input_minus_f_baseline"]) for s in torch_path["completeness"]["per_state"]
    )
    for key in ("mean_abs", "mean_signed"):
        assert_close_scaled(
            [g[key] for g in cuda["groups"]], [g[key] for g in torch_path["groups"]], ulps=1024, scale=scale
        )
    assert_close_scaled(
        [s["sum_attributions"] for s in cuda["completeness"]["per_state"]],
        [s["sum_attributions"] for s in torch_path["completeness"]["per_state"]],
        ulps=1024,
        scale=scale,
    )
    assert [f["name"] for f in cuda["top_10_by_mean_abs"][:3]] == [
        f["name"] for f in torch_path["top_10_by_mean_abs"][:3]
    ]
    if cuda_logger is None:
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(cuda_logger.log_dir, size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    assert "ig/2_saliency" in tags["images"]
    assert len([tag for tag in tags["scalars"] if tag.startswith("ig/")]) <= 40


def test_group_sums_on_the_gpu_equal_the_cpu_and_repeat_bit_for_bit(cuda_device):
    from lightning_ig.attribution.groups import FeatureGroups

    generator = torch.Generator().manual_seed(3)
    for shape, spec in (((4, 84, 84), "channels"), ((3, 17, 9), torch.randint(0, 7, (3, 17, 9), generator=generator))):
        groups = FeatureGroups.resolve(spec, shape)
        attributions = torch.randn(33, *shape, generator=generator)
        on_gpu = groups.sum(attributions.to(cuda_device))
        assert torch.equal(on_gpu, groups.sum(attributions.to(cuda_device)))  # no atomics: the same bits again
        assert_close_scaled(
            on_gpu.cpu(),
            groups.sum(attributions),
            ulps=64,
            scale=float(attributions.abs().reshape(33, -1).sum(1).max()),
        )


def test_a_run_ended_at_the_next_step_holds_what_a_run_ended_at_once_computes(tmp_path, cuda_device):
    """On CUDA a run's numbers travel to pinned memory behind an event and are read one step later."""
    pl.seed_everything(4)
    model = TinyQNet(lr=0.0, batchnorm=False)  # the weights stay: the deferred run and the direct one agree
    callback = IntegratedGradientsCallback(
        held_out_states(64), every_n_steps=2, run_at_train_end=False, engine=IGOptions(n_steps=16, backend="cuda")
    )
    trainer = _trainer(tmp_path, [callback], max_steps=5)
    trainer.fit(model, DataLoader(dataset(), batch_size=32))
    assert [entry["global_step"] for entry in callback.history] == [2, 4]
    assert callback._pending is None  # the run of step 4 ended at step 5's batch end or at the end of training
    deferred = callback.history[-1]["mean_abs"]
    model.to(cuda_device)  # Lightning's teardown moved it to the CPU, and the callback let go of its worker and copies
    callback._run(trainer, model, final=False)  # started and ended at once, same weights and states
    assert callback.history[-1]["mean_abs"] == deferred


@pytest.mark.parametrize(
    "engine",
    [IGOptions(), IGOptions(n_steps="auto"), IGOptions(backend="torch", n_steps="auto"), IGOptions(backend="torch")],
    ids=["defaults", "auto", "torch-auto", "torch"],
)
def test_a_deterministic_fit_on_the_gpu_runs_the_callback(tmp_path, cuda_device, engine):
    # Trainer(deterministic=True) turns on torch.use_deterministic_algorithms, under which some CUDA ops (a median
    # with indices, a cumulative sum) raise where only a nondeterministic kernel exists: the callback's runs, their
    # estimate and their trust checks must run there, and give the numbers they give without it
    reports = []
    for deterministic in (True, False):
        pl.seed_everything(0)
        callback = IntegratedGradientsCallback(
            held_out_states(64), every_n_steps=5, feature_names=FEATURES, engine=engine, overhead=None
        )
        try:
            _trainer(tmp_path / str(deterministic), [callback], max_steps=10, deterministic=deterministic).fit(
                TinyQNet(), DataLoader(dataset(), batch_size=32)
            )
        finally:
            torch.use_deterministic_algorithms(False)
        assert [entry["global_step"] for entry in callback.history] == [5, 10]
        reports.append(callback.history[-1])
    on, off = reports
    for key in ("mean_abs", "mean_signed", "mass"):
        assert torch.allclose(torch.tensor(on[key]), torch.tensor(off[key]), rtol=1e-4, atol=1e-6), key
    assert on["verdict"] == off["verdict"]


def test_a_states_callable_that_samples_on_the_gpu_leaves_trainings_cuda_draws(tmp_path, cuda_device):
    # guards against: the states callable run at set-up with the generators of the model's devices kept, while the
    # model is still on the CPU (Lightning moves it after set-up): one that samples on the GPU (a replay buffer kept
    # there) moved the CUDA generator that training's dropout and noise draw from
    def sampled(trainer, pl_module):
        rows = torch.randint(0, 256, (9,), device=cuda_device)
        return dataset().tensors[0][rows.cpu()]

    after = []
    for callbacks in ([], [IntegratedGradientsCallback(sampled, every_n_steps=3, engine=IGOptions(n_steps=8))]):
        pl.seed_everything(123)
        _trainer(tmp_path, callbacks, max_steps=6).fit(TinyQNet(), DataLoader(dataset(), batch_size=32))
        after.append(torch.cuda.get_rng_state(cuda_device))
    assert callbacks[0].history, "the callback never ran"
    assert torch.equal(after[0], after[1]), "the CUDA generator moved"
