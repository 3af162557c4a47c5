"""The callback's JSON reports: names it makes up are never written through a link, and a lost report never
ends training: it is warned about (the path and the error), counted, and the count is said when training ends."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import lightning_ig.callback.reports
from lightning_ig._files import file_name_limit
from lightning_ig.attribution import IGOptions
from lightning_ig.callback import IntegratedGradientsCallback
from tests.support.tiny import TinyQNet, dataset, held_out_states, make_trainer


def _fit(tmp_path: Path, callback: IntegratedGradientsCallback, max_steps: int = 3) -> tuple[int, list[str]]:
    """Train ``max_steps`` steps; the steps done and the warnings' messages."""
    trainer = make_trainer(tmp_path, [callback], max_steps=max_steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TinyQNet(noisy=False, dropout=0.0, batchnorm=False), DataLoader(dataset(), batch_size=16))
    return trainer.global_step, [str(warning.message) for warning in caught]


def _callback(report_dir: Path, **options: object) -> IntegratedGradientsCallback:
    states = options.pop("states", held_out_states(8))
    return IntegratedGradientsCallback(
        states, every_n_steps=1, report_dir=report_dir, **options, engine=IGOptions(n_steps=4)
    )


def _about_reports(messages: list[str]) -> list[str]:
    return [message for message in messages if "report" in message and "could not be written" in message]


def test_a_link_planted_at_a_reports_name_is_not_followed(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("nobody named me")
    (reports / "ig_report_step=00000001.json").symlink_to(victim)
    steps, messages = _fit(tmp_path, _callback(reports))
    assert steps == 3, "training finished"
    assert victim.read_text() == "nobody named me"
    assert (reports / "ig_report_step=00000001.json").is_symlink(), "refused: the link is left as it was"
    assert json.loads((reports / "ig_report_step=00000002.json").read_text())["global_step"] == 2
    first, end = _about_reports(messages)
    assert "ig_report_step=00000001.json" in first and "is a symbolic link" in first and "training goes on" in first
    link = reports / "ig_report_step=00000001.json"
    assert end.endswith(
        f"1 of 3 reports could not be written, the first: {link} (the report '{link}' is a symbolic link "
        f"(to '{victim}'); lightning-ig makes this name itself and never writes through a link: remove the link, "
        "or choose another folder)"
    )


def test_a_full_disk_warns_once_keeps_training_and_counts_lost_reports(tmp_path: Path, monkeypatch) -> None:
    def full_disk(report: object, path: object, **options: object) -> None:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(lightning_ig.callback.reports, "write_report", full_disk)
    steps, messages = _fit(tmp_path, _callback(tmp_path / "reports"))
    assert steps == 3
    first, end = _about_reports(messages)
    path = tmp_path / "reports" / "ig_report_step=00000001.json"
    assert f"a report could not be written: {path} (No space left on device)" in first
    assert end.endswith(f"3 of 3 reports could not be written, the first: {path} (No space left on device)")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_a_report_dir_made_read_only_after_set_up_keeps_training(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    callback = _callback(reports)

    original = callback.on_fit_start

    def lock_then_start(trainer, pl_module) -> None:
        original(trainer, pl_module)
        reports.chmod(0o500)

    callback.on_fit_start = lock_then_start  # type: ignore[method-assign]
    try:
        steps, messages = _fit(tmp_path, callback)
    finally:
        reports.chmod(0o700)
    assert steps == 3 and list(reports.iterdir()) == []
    first = reports / "ig_report_step=00000001.json"
    assert _about_reports(messages)[-1].endswith(
        f"3 of 3 reports could not be written, the first: {first} (the report '{first}' is not writable; "
        "choose a folder you can write to)"
    )


def test_a_report_never_replaces_the_states_file(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    states_file = reports / "ig_report_step=00000001.json"  # the states, under the name of the first report
    states_file.write_text(json.dumps({"states": held_out_states(8).tolist()}))
    before = states_file.read_bytes()
    steps, messages = _fit(tmp_path, _callback(reports, states=states_file), max_steps=2)
    assert steps == 2 and states_file.read_bytes() == before
    assert "is also an input of this run" in _about_reports(messages)[0]


def test_a_name_too_long_for_the_file_system_fails_at_set_up(tmp_path: Path) -> None:
    limit = file_name_limit(tmp_path)
    callback = _callback(tmp_path / "reports", name="x" * 250)
    longest = len("ig_report_") + 250 + len("_step=") + 19 + len(".json")  # 19 digits: the largest 64-bit step
    words = rf"name='xxx.*\.\.\.' makes report file names of up to {longest} bytes .* more than the {limit} the file"
    with pytest.raises(ValueError, match=words + " system of report_dir .* takes"):
        make_trainer(tmp_path, [callback], max_steps=1).fit(TinyQNet(), DataLoader(dataset(), batch_size=16))
    assert not (tmp_path / "reports").exists(), "refused before the folder is made"
    name = "x" * (limit - (longest - 250))  # the longest name that fits
    steps, _ = _fit(tmp_path, _callback(tmp_path / "reports", name=name), max_steps=1)
    assert steps == 1
    assert [path.name for path in (tmp_path / "reports").iterdir()] == [f"ig_report_{name}_step=00000001.json"]


def test_the_report_files_hold_the_verdict_and_the_trust_checks(tmp_path: Path) -> None:
    import jsonschema

    from lightning_ig.views.report import load_schema

    folder = tmp_path / "reports"
    _fit(tmp_path, _callback(folder), max_steps=2)
    files = sorted(folder.glob("ig_report_step=*.json"))
    assert [path.name for path in files] == ["ig_report_step=00000001.json", "ig_report_step=00000002.json"]
    for path in files:
        report = json.loads(path.read_text())
        jsonschema.validate(report, load_schema())
        assert isinstance(report["verdict"]["within"], bool)
        assert report["completeness"]["verdict"]["figure"] == report["verdict"]["figure"]
        assert "trust" in report and isinstance(report["trust"], dict)


def test_the_report_files_keep_every_drift_key_of_schema_v1(tmp_path: Path) -> None:
    # Schema-v1 reports held spearman_prev, spearman_first and topk_jaccard_prev from the second run on, whatever the
    # number of units: 4 features under top_k=10 (the overlap 1 by construction) and 2 groups must keep all three.
    for name, options in (("features", {}), ("groups", {"feature_groups": {"cart": [0, 1], "pole": [2, 3]}})):
        folder = tmp_path / name
        _fit(tmp_path, _callback(folder, **options), max_steps=2)
        first, second = (json.loads(path.read_text()) for path in sorted(folder.glob("ig_report_step=*.json")))
        assert first["drift"] == {}
        assert set(second["drift"]) == {"spearman_prev", "spearman_first", "topk_jaccard_prev"}, name
        assert second["drift"]["topk_jaccard_prev"] == 1.0
