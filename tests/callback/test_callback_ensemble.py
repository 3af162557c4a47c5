"""Ensembles in the callback: each member attributed beside the aggregate, agreement and completeness logged."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions, integrated_gradients
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.callback.monitor import trust_scalar_tags
from lightning_ig.ensemble import Ensemble, MemberRun, find_ensemble, pack_members
from lightning_ig.models.noise import attribution_mode
from lightning_ig.run.agreement import ensemble_scalar_names, ensemble_summary, member_agreement, member_label
from lightning_ig.run.gather import JointGather
from lightning_ig.run.host_result import HostResult
from lightning_ig.views.report import load_schema
from tests.support import REPO
from tests.support.tiny import FEATURES, EnsembleQNet, dataset, held_out_states, make_trainer
from tests.support.tolerance import assert_close_scaled, eps
from tests.support.trust import checks_without_budget

N_STEPS = 32


def _fit(root: Path, callbacks: list, *, logger: Any = False, max_steps: int = 4) -> EnsembleQNet:
    torch.manual_seed(0)
    model = EnsembleQNet()
    make_trainer(root, callbacks, max_steps=max_steps, logger=logger).fit(model, DataLoader(dataset(64), batch_size=16))
    return model


@pytest.fixture(scope="module")
def ensemble_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ensemble")
    states = held_out_states(12)
    callback = IntegratedGradientsCallback(
        states, every_n_steps=2, feature_names=FEATURES, report_dir=root / "reports", engine=IGOptions(n_steps=N_STEPS)
    )
    logger = TensorBoardLogger(root, name="tb")
    with checks_without_budget():  # every trust tag at the first run
        model = _fit(root, [callback], logger=logger)
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    report = json.loads((root / "reports" / "ig_report_step=00000004.json").read_text())
    with attribution_mode(model):  # what the callback attributed at the last step: the final weights, noise off
        aggregate = integrated_gradients(model, states, n_steps=N_STEPS)
        members = integrated_gradients(model.ensemble.member_signals, states, target="each", n_steps=N_STEPS)
    return {
        "events": events,
        "report": report,
        "aggregate": aggregate,
        "members": members,
        "callback": callback,
        "model": model,
        "root": root,
    }


def _last(events: EventAccumulator, tag: str) -> float:
    return events.Scalars(tag)[-1].value


def test_every_ensemble_tag_is_logged_and_listed(ensemble_run):
    scalars = set(ensemble_run["events"].Tags()["scalars"])
    expected = {f"ig/ensemble/{name}" for name in ensemble_scalar_names(3)}
    assert {
        "ig/ensemble/spearman/member_2",
        "ig/ensemble/completeness/member_0",
        "ig/ensemble/relative_spread",
    } <= expected
    assert expected <= scalars
    trust = trust_scalar_tags("ig", noisy=True)  # the trust checks' (noisy members; at the first run)
    assert {tag for tag in scalars if tag.startswith("ig/")} == {
        *ensemble_run["callback"]._fit.outputs.tags.scalar_tags(10),
        *trust,
        "ig/overhead",  # the budget's measure (callback/budget.py), at every run
    }
    text = ensemble_run["events"].Tensors("ig/report/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "**Ensemble** (3 members" in text and "Member completeness passes" in text
    documented = (REPO / "docs" / "tensorboard-tags.md").read_text()
    for tag in (
        "ig/ensemble/spearman_mean",
        "ig/ensemble/spearman/member_<m>",
        "ig/ensemble/completeness/member_<m>",
        "ig/ensemble/relative_spread",
        "ig/ensemble/completeness/worst_relative_error",
    ):
        assert f"`{tag}`" in documented


def test_completeness_holds_for_the_aggregate_and_each_member(ensemble_run):
    events, aggregate, members = ensemble_run["events"], ensemble_run["aggregate"], ensemble_run["members"]
    tolerance = 1e-3
    assert aggregate.worst_relative_error < tolerance and members.worst_relative_error < tolerance
    assert _last(events, "ig/completeness/worst_mass_relative_error") < tolerance
    for m in range(3):
        logged = _last(events, f"ig/ensemble/completeness/member_{m}")
        worst = float(members.relative_error[m].max())
        assert logged < tolerance
        # The logged error is the engine's, as a float32 scalar: a ratio of roundings of delta (size |sum| + |dF|)
        scale = float(((members.f_input[m] - members.f_baseline[m]).abs() + members.delta[m].abs()).max())
        smallest = float((members.f_input[m] - members.f_baseline[m]).abs().min())
        assert abs(logged - worst) <= 64 * eps(torch.float32) * (worst + scale / smallest), (logged, worst)
    assert _last(events, "ig/ensemble/completeness/worst_relative_error") == max(
        _last(events, f"ig/ensemble/completeness/member_{m}") for m in range(3)
    )
    # A member's IG adds up per state, as does the aggregate's: its attributions are the weighted members'.
    combined = torch.einsum("m,mbf->bf", ensemble_run["model"].ensemble.weights, members.attributions)
    assert_close_scaled(combined, aggregate.attributions, ulps=64, scale=float(aggregate.attributions.abs().max()))


def test_agreement_scalars_are_those_of_the_members_attributions(ensemble_run):
    events, aggregate, members = ensemble_run["events"], ensemble_run["aggregate"], ensemble_run["members"]
    expected = member_agreement(
        aggregate.attributions.double().abs().mean(0), members.attributions.double().abs().mean(1)
    )
    for key in ("spread", "relative_spread"):
        assert _last(events, f"ig/ensemble/{key}") == pytest.approx(expected[key], rel=256 * eps(torch.float32))
    # Spearman over 4 features is a ratio of small integers: equal unless two features' ranks are within rounding.
    for m in range(3):
        assert _last(events, f"ig/ensemble/spearman/member_{m}") == pytest.approx(
            expected["spearman"][m], rel=eps(torch.float32)
        )


def test_report_holds_the_members_beside_the_schema_v1_keys(ensemble_run):
    report, members = ensemble_run["report"], ensemble_run["members"]
    jsonschema.validate(report, load_schema(), cls=jsonschema.Draft202012Validator)
    assert report["forward_target"] == "output" and report["num_states"] == 12
    ensemble = report["ensemble"]
    assert ensemble["num_members"] == 3 and ensemble["weights"] == pytest.approx([0.5, 1 / 3, 1 / 6])
    for m, member in enumerate(ensemble["members"]):
        sums = members.attributions[m].double().sum(1)
        assert_close_scaled(
            [s["sum_attributions"] for s in member["per_state"]],
            sums,
            ulps=64,
            scale=float(members.attributions[m].double().abs().sum(1).max()),
        )
        assert member["worst_relative_error"] < 1e-3 and member["num_non_finite"] == 0
        assert {f["name"] for f in member["top_features"]} <= set(FEATURES)
    broken = json.loads(json.dumps(report))
    broken["ensemble"]["members"][0]["spearman_vs_aggregate"] = 1.5  # the schema documents the key: it is checked
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, load_schema(), cls=jsonschema.Draft202012Validator)


def test_training_with_the_ensemble_callback_is_bit_identical(tmp_path):
    callback = IntegratedGradientsCallback(held_out_states(5), every_n_steps=1, engine=IGOptions(n_steps=4))
    with_callback = _fit(tmp_path / "with", [callback], max_steps=3)
    without = _fit(tmp_path / "without", [], max_steps=3)
    assert callback._fit.members is not None and len(callback.history) == 3
    for (name, a), (_, b) in zip(with_callback.state_dict().items(), without.state_dict().items()):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------------------- finding the ensemble


class _Wrapped(nn.Module):
    def __init__(self, head: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ensemble = Ensemble([nn.Linear(4, 2), nn.Linear(4, 2)])
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2.0 * self.ensemble(x) if self.head else self.ensemble(x)


def test_the_ensemble_is_found_only_when_its_aggregate_is_what_is_attributed():
    sample = torch.randn(2, 4)
    plain = Ensemble([nn.Linear(4, 2)])
    assert find_ensemble(plain, sample) is plain
    wrapped = _Wrapped(head=False)
    assert find_ensemble(wrapped, sample) is wrapped.ensemble
    assert find_ensemble(_Wrapped(head=True), sample) is None  # a head on top: another signal
    two = nn.ModuleDict({"a": Ensemble([nn.Linear(4, 2)]), "b": Ensemble([nn.Linear(4, 2)])})
    assert find_ensemble(two, sample) is None
    assert member_label(3, 12) == "member_03" and member_label(0, 1) == "member_0"


def test_members_gathered_with_an_uneven_split_equal_one_process(ensemble_run):
    """Two ranks' shares (the last padded), gathered in one collective with the aggregate: the numbers of all states."""
    model, states = ensemble_run["model"], held_out_states(7)
    with attribution_mode(model):
        whole = integrated_gradients(model.ensemble.member_signals, states, target="each", n_steps=8)
        aggregate = integrated_gradients(model, states, n_steps=8)
        shares = [torch.arange(0, 4), torch.tensor([4, 5, 6, 6])]  # ceil(7 / 2) = 4 rows each
        local = [
            (
                integrated_gradients(model, states[rows], n_steps=8),
                integrated_gradients(model.ensemble.member_signals, states[rows], target="each", n_steps=8),
            )
            for rows in shares
        ]
    calls: list[torch.Size] = []

    def all_gather(joint: torch.Tensor) -> torch.Tensor:  # what rank 0 receives: every rank's joint rows, stacked
        calls.append(joint.shape)
        from lightning_ig.attribution.result import pack

        other = torch.cat([pack(local[1][0])[0], pack_members(local[1][1])], dim=1)
        return torch.stack([joint, other])

    gather = JointGather(all_gather, [pack_members(local[0][1])])
    host = HostResult.from_result(local[0][0], gather=gather, num_states=7)
    gathered = MemberRun.from_packed(gather.riders[0], 3, num_states=7)
    assert len(calls) == 1  # one collective for the aggregate and the members
    expected = MemberRun.from_result(whole)
    for field in ("f_input", "f_baseline", "sum_attributions"):
        assert_close_scaled(
            getattr(gathered, field),
            getattr(expected, field),
            ulps=64,
            scale=float(np.abs(getattr(expected, field)).max()),
        )
    assert_close_scaled(gathered.mean_abs, expected.mean_abs, ulps=64)
    assert_close_scaled(host.f_input, aggregate.f_input.double(), ulps=64)
    summary = ensemble_summary(aggregate, whole)
    assert summary["num_members"] == 3 and len(summary["members"][0]["per_state"]) == 7


def test_member_completeness_reads_nan_and_inf_as_the_aggregate_does():
    def run(relative_error: list[list[float]], degenerate: list[list[bool]], non_finite: list[list[bool]]) -> MemberRun:
        zeros = np.zeros((len(relative_error), len(relative_error[0])))
        return MemberRun(
            np.ones((len(zeros), 2)),
            np.ones((len(zeros), 2)),
            zeros,
            zeros,
            zeros,
            zeros,
            np.asarray(relative_error),
            np.asarray(degenerate),
            np.asarray(non_finite),
        )

    worst = run(
        [[0.1, math.nan], [math.nan, math.nan], [0.2, math.inf]],
        [[False, True], [True, True], [False, False]],
        [[False, False], [False, False], [False, True]],
    ).worst_relative_errors()
    assert worst[0] == 0.1 and math.isnan(worst[1]) and worst[2] == math.inf
