"""The modules one steady-state callback run enters, as docs/ARCHITECTURE.md counts them ("One callback run").

A run is traced with ``sys.setprofile``: every function called on the training thread under
``IntegratedGradientsCallback._start`` and under the ``_finish`` that ends the same run (a training step or more
later) is recorded by the module it is defined in. The engine's graphs are replayed (the capture emulated on the
CPU, as in tests/attribution/test_engine.py); what a replayed computation itself calls is not counted, since a CUDA
graph's replay runs no Python, nor what the logging worker runs on its own thread (TensorBoard's events, the report
text's words). Runs 1 to 4 are steady: the first run captured (and made the trust checks), and no picture or trust
check is due until the run at the end of training.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader

import lightning_ig.attribution.engine as engine_module
import lightning_ig.callback.fit as fit_module
from lightning_ig.attribution import IGOptions
from lightning_ig.callback import IntegratedGradientsCallback
from tests.support.graphs import EmulatedCapture
from tests.support.tiny import TinyQNet, dataset, has_tensorboard, held_out_states, make_trainer

STEADY = {
    "callback/callback.py",
    "callback/budget.py",  # the run's plan: its share of the states, its checks; its cost booked
    "models/noise.py",  # attribution_mode: eval, noise off, generators kept
    "attribution/engine.py",  # the fast path: the inputs copied in, the graph replayed (training stream)
    "run/host_result.py",
    "attribution/result.py",  # build_result, the rows packed as one tensor (pack), the worst figures
    "run/statistics.py",
    "run/summary.py",
    "views/loggers/outputs.py",
}

WORKER = {"views/loggers/worker.py"}  # a TensorBoardLogger: the run's events handed to the logging worker
TRUST = {"callback/monitor.py", "trust/verdict.py"}  # the run that makes the verdict


def _modules_per_run(
    tmp_path: Path, logger: Any, monkeypatch: pytest.MonkeyPatch, overhead: float | None
) -> list[set[str]]:
    monkeypatch.setattr(engine_module, "GraphCapture", EmulatedCapture)
    monkeypatch.setattr(fit_module, "idle_core", lambda *args: None)  # a device's path: runs on the training thread
    entered: dict[int, set[str]] = {}  # the run's step -> the modules its start and its end entered

    def tracing(method: Any, step_of: Any) -> Any:
        def traced(self: IntegratedGradientsCallback, *args: Any, **kwargs: Any) -> Any:
            seen = entered.setdefault(step_of(args), set())
            replaying: list[None] = []

            def profile(frame: FrameType, event: str, arg: object) -> None:
                code = frame.f_code
                if code.co_name == "compute" and code.co_filename.endswith("attribution/graphs.py"):
                    if event == "call":
                        replaying.append(None)
                    elif event == "return":
                        replaying.pop()
                elif event == "call" and not replaying and "/lightning_ig/" in code.co_filename:
                    seen.add(code.co_filename.rsplit("/lightning_ig/", 1)[1])

            sys.setprofile(profile)
            try:
                return method(self, *args, **kwargs)
            finally:
                sys.setprofile(None)

        return traced

    start, finish = IntegratedGradientsCallback._start, IntegratedGradientsCallback._finish
    monkeypatch.setattr(IntegratedGradientsCallback, "_start", tracing(start, lambda args: args[0].global_step))
    monkeypatch.setattr(IntegratedGradientsCallback, "_finish", tracing(finish, lambda args: args[0].step))
    callback = IntegratedGradientsCallback(
        held_out_states(16), every_n_steps=1, overhead=overhead, engine=IGOptions(n_steps=8)
    )
    # A steady run has nothing new to warn about (a trouble first seen in runs 1-4 would name the callback, once)
    callback._warned.update(("non-finite", "unchecked", "fail", "stochastic", "members-fail"))
    pl.seed_everything(0)
    trainer = make_trainer(tmp_path, [callback], max_steps=6, logger=logger)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyQNet(), DataLoader(dataset(64), batch_size=8))
    assert sorted(entered) == [1, 2, 3, 4, 5, 6]  # one run a step; the end of training falls on the last step
    return [entered[step] for step in sorted(entered)]


def test_a_steady_run_enters_nine_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered = _modules_per_run(tmp_path, CSVLogger(tmp_path), monkeypatch, overhead=None)
    assert {"attribution/graphs.py", "attribution/engine.py", "models/noise.py"} <= entered[0]  # the first captured
    for seen in entered[1:5]:
        assert seen == STEADY  # 9: the graph replayed on the training stream
    assert len(STEADY) == 9


@pytest.mark.skipif(not has_tensorboard(), reason="needs tensorboard and Pillow")
def test_a_steady_run_with_tensorboard_also_hands_its_events_to_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered = _modules_per_run(tmp_path, TensorBoardLogger(tmp_path), monkeypatch, overhead=None)
    for seen in entered[1:5]:
        assert seen == STEADY | WORKER  # 10: the text's words are made on the worker thread
    # the end of training draws the charts, on the logging worker: the training thread hands the run over
    assert not {"views/pictures/draw.py", "views/pictures/cards.py"} & entered[-1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = {path.parent for path in tmp_path.rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(folder), size_guidance={"images": 0})
    events.Reload()
    assert "ig/0_verdict" in events.Tags()["images"]


def test_a_steady_run_with_the_trust_checks_on_enters_them_only_where_the_budget_makes_a_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the first run makes every check and the verdict; a run between checks carries it (the suite's frozen clock:
    # the next checks are due CHECK_EVERY = 5 runs later, at the sixth run, the end of training).
    default = inspect.signature(IntegratedGradientsCallback).parameters["overhead"].default
    assert default == 0.02
    entered = _modules_per_run(tmp_path, TensorBoardLogger(tmp_path), monkeypatch, overhead=default)
    assert entered[0] >= TRUST and entered[5] >= TRUST
    assert entered[1:5] == [STEADY | WORKER] * 4  # 10: no module of trust/
