"""Pictures, tables and reports through Lightning's WandbLogger (offline) and MLFlowLogger (file store), read back."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lightning_ig.run.host_result import Moments
from lightning_ig.run.summary import Units
from lightning_ig.views.loggers.sinks import MlflowSink, WandbSink, mlflow_metrics, picture_sinks, unit_table
from tests.support.loggers import logger_package, mlflow_pictures, wandb_history


def _picture(height: int = 37, width: int = 53) -> np.ndarray:
    """A picture of distinct colours (a lossless store gives the same pixels back)."""
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def _report() -> dict:
    return {
        "schema_version": 1,
        "features": [{"name": "ball", "mean_abs": 0.25, "stddev": 0.5, "mean_signed": -0.1}],
        "completeness": {"worst_relative_error": None},
    }  # None for NaN: the reports' rule


def _units() -> Units:
    values = np.array([[1.0, -2.0, 0.5], [3.0, 3.0, -0.5]])  # mean |attr| 2, 2.5, 0.5
    return Units("features", ["paddle", "ball", "trail"], Moments.of(values))


def test_unit_table_ranks_units_by_mass_and_splits_their_sign():
    columns, rows = unit_table(["paddle", "ball", "trail"], _units())
    assert columns[:5] == ["rank", "name", "share", "raises", "lowers"]
    assert [row[1] for row in rows] == ["ball", "paddle", "trail"]
    eps = np.finfo(np.float64).eps
    assert sum(row[2] for row in rows) == pytest.approx(1.0, rel=8 * eps)
    for row in rows:
        positive, negative, mean_abs = row[3], row[4], row[5]
        assert positive + negative == pytest.approx(mean_abs, rel=4 * eps)
    ball = rows[0]
    assert ball[3] == pytest.approx(1.5) and ball[4] == pytest.approx(1.0)  # -2 and +3: 3/2 and 2/2 per state
    assert [row[1] for row in unit_table(["paddle", "ball", "trail"], _units(), top_k=1)[1]] == ["ball"]


def test_only_wandb_and_mlflow_get_sinks(tmp_path):
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    assert picture_sinks([CSVLogger(tmp_path), TensorBoardLogger(tmp_path), object()]) == []


@pytest.fixture
def wandb_logger(tmp_path, monkeypatch):
    logger_package("wandb")  # the [wandb] extra, in the dev extra
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="lightning-ig-test")
    yield logger
    logger.experiment.finish()


def test_wandb_offline_run_holds_the_pictures_table_and_report(wandb_logger, tmp_path):
    (sink,) = picture_sinks([wandb_logger])
    assert isinstance(sink, WandbSink)
    pixels = _picture()
    sink.pictures({"ig/1_top_features": pixels, "ig/2_saliency": _picture(20, 30)}, step=40)
    columns, rows = unit_table(["paddle", "ball", "trail"], _units())
    sink.table("ig/features", columns, rows, step=40)
    sink.report("ig/report.json", _report(), step=40)
    run_dir = wandb_logger.experiment.dir  # <tmp>/wandb/offline-run-<time>-<id>/files
    wandb_logger.experiment.finish()
    logger_package("wandb").teardown()  # the W&B service writes the run's log file out when it stops

    files = Path(run_dir)
    (run_file,) = files.parent.glob("run-*.wandb")
    rows = {
        key.removesuffix("/filenames"): row
        for row in wandb_history(run_file)
        for key in row
        if key.endswith("/filenames")
    }
    assert set(rows) == {"ig/1_top_features", "ig/2_saliency"}
    assert rows["ig/1_top_features"]["_step"] == rows["ig/2_saliency"]["_step"]  # a run's pictures: one W&B step
    for tag, expected in (("ig/1_top_features", pixels), ("ig/2_saliency", None)):
        row = rows[tag]
        assert row["trainer/global_step"] == 40  # the trainer's step, beside W&B's own
        (name,) = row[f"{tag}/filenames"]
        stored = np.asarray(Image.open(files / name).convert("RGB"))
        assert stored.shape[:2] == (row[f"{tag}/height"], row[f"{tag}/width"])
        if expected is not None:
            assert np.array_equal(stored, expected)
        else:
            assert stored.shape == (20, 30, 3)
    (table,) = (files / "media" / "table").rglob("*.table.json")
    stored_table = json.loads(table.read_text())
    assert stored_table["columns"] == columns and [row[1] for row in stored_table["data"]] == [
        "ball",
        "paddle",
        "trail",
    ]
    report = json.loads((files / "ig" / "report.json").read_text())
    assert report["schema_version"] == 1 and report["completeness"]["worst_relative_error"] is None


@pytest.fixture
def mlflow_logger(tmp_path, monkeypatch):
    logger_package("mlflow")  # the [mlflow] extra, in the dev extra
    from lightning.pytorch.loggers import MLFlowLogger

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    return MLFlowLogger(experiment_name="lightning-ig-test", tracking_uri=f"file:{tmp_path / 'mlruns'}")


def test_mlflow_file_store_holds_the_pictures_table_and_report(mlflow_logger, tmp_path):
    from mlflow import MlflowClient

    (sink,) = picture_sinks([mlflow_logger])
    assert isinstance(sink, MlflowSink)
    pixels = _picture()
    sink.pictures({"ig/1_top_features": pixels}, step=40)
    sink.pictures({"ig/value/2_saliency∕frames": _picture(20, 30)}, step=41)  # a callback name and a display label
    sink.pictures({"ig/1_top_features": pixels[::-1]}, step=80)
    columns, rows = unit_table(["paddle", "ball", "trail"], _units())
    sink.table("ig/features", columns, rows, step=40)
    sink.report("ig/report_step_40.json", _report(), step=40)

    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    run_id = mlflow_logger.run_id
    images = mlflow_pictures(client, run_id)  # the PNGs by (key, step); MLflow's "/" in keys read back as "/"
    # each picture at its run's step; a key's first also at step 0, where MLflow's UI opens the card
    top_steps = {("ig/1_top_features", step) for step in (0, 40, 80)}
    frames_key = f"ig/value/2_saliency_frames {zlib.crc32('ig/value/2_saliency∕frames'.encode()):08x}"  # kept apart
    assert set(images) == top_steps | {(frames_key, step) for step in (0, 41)}
    target = tmp_path / "download"
    top = np.asarray(Image.open(client.download_artifacts(run_id, images["ig/1_top_features", 40], str(target))))
    assert np.array_equal(top, pixels)
    later = np.asarray(Image.open(client.download_artifacts(run_id, images["ig/1_top_features", 80], str(target))))
    assert np.array_equal(later, pixels[::-1])
    frames = Image.open(client.download_artifacts(run_id, images[frames_key, 41], str(target)))
    assert np.asarray(frames.convert("RGB")).shape == (20, 30, 3)
    table_path = client.download_artifacts(run_id, "lightning_ig/ig/features/step_00000040.json", str(target))
    table = json.loads(Path(table_path).read_text())
    assert table["columns"] == columns and [row[1] for row in table["data"]] == ["ball", "paddle", "trail"]
    report_path = client.download_artifacts(run_id, "lightning_ig/ig/report_step_40.json", str(target))
    report = json.loads(Path(report_path).read_text())
    assert report["features"][0]["name"] == "ball" and report["completeness"]["worst_relative_error"] is None

    # Tags that differ only in what MLflow refuses keep their own keys (was: one); a long one still makes a file name.
    sink.pictures({"ig/value/2_saliency·frames": pixels}, step=120)  # was: the same key as "...∕frames" above
    sink.pictures({f"ig/{'n' * 240}/0_verdict": pixels}, step=120)  # was: OSError, file name too long, mid-fit
    added = set(mlflow_pictures(client, run_id)) - set(images)
    other = f"ig/value/2_saliency_frames {zlib.crc32('ig/value/2_saliency·frames'.encode()):08x}"
    keys = {key for key, _ in added}  # each new key's first picture at step 0 too
    assert len(keys) == 2 and other in keys and other != frames_key and all(len(key) <= 150 for key in keys)
    assert added == {(key, step) for key in keys for step in (0, 120)}


def test_a_resumed_mlflow_run_gets_no_second_step_0_picture(mlflow_logger, tmp_path):
    # guards against: a fit resumed into the same MLflow run (MLFlowLogger(run_id=...), ckpt_path=) made a new sink that
    # logged each key's first picture at step 0 again: two step-0 pictures per tag in the run
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow import MlflowClient

    (first,) = picture_sinks([mlflow_logger])
    first.pictures({"ig/0_verdict": _picture()}, step=40)
    uri = f"file:{tmp_path / 'mlruns'}"
    resumed = MLFlowLogger(experiment_name="lightning-ig-test", tracking_uri=uri, run_id=mlflow_logger.run_id)
    (again,) = picture_sinks([resumed])
    again.pictures({"ig/0_verdict": _picture(), "ig/1_top_features": _picture()}, step=80)  # one tag new to the run
    client = MlflowClient(tracking_uri=uri)
    pngs = [info.path for info in client.list_artifacts(mlflow_logger.run_id, "images") if info.path.endswith(".png")]
    steps = sorted(
        (path.split("/")[-1].split("+step+")[0], int(path.split("+step+")[1].split("+")[0])) for path in pngs
    )
    assert steps == [
        ("ig~0_verdict", 0),
        ("ig~0_verdict", 40),
        ("ig~0_verdict", 80),
        ("ig~1_top_features", 0),
        ("ig~1_top_features", 80),
    ]


def test_an_mlflow_store_down_at_fit_start_is_a_refused_write_not_a_failed_set_up(mlflow_logger, monkeypatch):
    # guards against: the resumed run's keys read when the sink was made, so a store that could not list them ended
    # the fit's set-up, where a refused write is said once and training goes on (RunOutputs._to_sink)
    from mlflow import MlflowClient

    def down(*args, **kwargs):
        raise ConnectionError("store down")

    monkeypatch.setattr(MlflowClient, "list_artifacts", down)
    (sink,) = picture_sinks([mlflow_logger])  # made without a call to the store
    with pytest.raises(ConnectionError, match="store down"):
        sink.pictures({"ig/0_verdict": _picture()}, step=40)


def test_a_picture_of_the_wrong_kind_is_refused_before_reaching_a_logger(mlflow_logger):
    (sink,) = picture_sinks([mlflow_logger])
    with pytest.raises(ValueError, match=r"\(H, W, 3\) uint8 array, got shape \(4, 4\)"):
        sink.pictures({"ig/x": np.zeros((4, 4), dtype=np.uint8)}, step=0)
    with pytest.raises(ValueError, match="names no file"):
        sink.report("../..", _report(), step=0)


def test_an_mlflow_that_cannot_read_its_pictures_back_is_named_in_a_warning(mlflow_logger, monkeypatch):
    import warnings

    mlflow = logger_package("mlflow")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the MLflow of the dev extra (3.11 or later): no warning
        picture_sinks([mlflow_logger])
    monkeypatch.setattr(mlflow, "__version__", "3.10.1")  # the last release that wrote "/" in an image key as "#"
    with pytest.warns(UserWarning, match=r"MLflow 3\.10\.1 stores the pictures .* pip install 'mlflow>=3\.11'"):
        picture_sinks([mlflow_logger])


def test_mlflow_metric_keys_keep_apart_the_names_mlflow_refuses(mlflow_logger):
    """Lightning's MLflow logger deletes what MLflow refuses in a key: ``ig/mean_abs/速度`` became ``ig/mean_abs/``,
    which MLflow refused mid-fit, and ``x (m∕s)`` / ``x m∕s`` one key. Each gets a key of its own that MLflow takes."""
    metrics = {"ig/mean_abs/速度": 1.0, "ig/mean_abs/x (m∕s)": 2.0, "ig/mean_abs/x m∕s": 3.0, "ig/time_ms": 4.0}
    metrics |= {f"ig/mean_signed/{'L' * 240}": 5.0, f"ig/mean_signed/{'L' * 241}": 6.0}  # was: refused mid-fit
    keys = mlflow_metrics(metrics)
    assert sorted(keys.values()) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] and keys["ig/time_ms"] == 4.0
    assert max(len(key) for key in keys) == 250
    assert all(re.fullmatch(r"[A-Za-z0-9_\-./ ]+", key) for key in keys)
    assert mlflow_metrics(metrics) == keys  # the same keys at every step
    mlflow_logger.log_metrics(keys, step=1)  # taken whole
    history = mlflow_logger.experiment.get_run(mlflow_logger.run_id).data.metrics
    assert {key: history[key] for key in keys} == keys
