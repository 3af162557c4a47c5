"""A fit with the callback and a W&B (offline) or MLflow (file store) logger: the pictures reach them, read back."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import jsonschema
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions
from lightning_ig.callback import IntegratedGradientsCallback
from lightning_ig.views.pictures.raster import CARD_WIDTH
from lightning_ig.views.report import load_schema
from tests.support.loggers import logger_package, mlflow_pictures
from tests.support.tiny import ConvQNet, frame_dataset, frames, make_trainer

SHAPE = (3, 8, 8)
# What a run of two IG runs (steps 2 and 4) of a pixel agent draws at its first run: every kind it has
FIRST_RUN = {"ig/0_verdict", "ig/1_over_training", "ig/2_saliency"}


def _fit(root: Path, logger) -> IntegratedGradientsCallback:
    torch.manual_seed(0)
    callback = IntegratedGradientsCallback(frames(6, SHAPE, seed=2), every_n_steps=2, engine=IGOptions(n_steps=8))
    data = DataLoader(frame_dataset(32, SHAPE), batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_trainer(root, [callback], max_steps=4, logger=logger).fit(ConvQNet(SHAPE), data)
    return callback


def test_an_mlflow_run_holds_every_picture_the_table_and_the_report(tmp_path, monkeypatch):
    logger_package("mlflow")  # the [mlflow] extra, in the dev extra
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    uri = f"file:{tmp_path / 'mlruns'}"
    logger = MLFlowLogger(experiment_name="lightning-ig", tracking_uri=uri)
    callback = _fit(tmp_path, logger)
    client = MlflowClient(tracking_uri=uri)
    pngs = mlflow_pictures(client, logger.run_id)  # by (tag, step)
    assert {tag for tag, step in pngs if step == 2} >= FIRST_RUN, sorted(pngs)
    # each picture at the run's step, the last run's too; a tag's first also at step 0, where MLflow's UI opens
    assert {step for _, step in pngs} == {0, 2, 4} and {tag for tag, step in pngs if step == 0} == FIRST_RUN
    saliency = client.download_artifacts(logger.run_id, pngs["ig/2_saliency", 2], str(tmp_path / "d"))
    decoded = np.asarray(Image.open(saliency))
    assert decoded.ndim == 3 and decoded.shape[1] == CARD_WIDTH  # the card-sized grid
    assert client.get_metric_history(logger.run_id, "ig/completeness/worst_attribution_error")  # scalars as before
    stored = [info.path for info in client.list_artifacts(logger.run_id, "lightning_ig/ig")]
    assert any("features" in path or "groups" in path for path in stored), stored
    reports = [path for path in stored if path.endswith(".json") and "report" in path]
    assert reports, stored
    report = json.loads(Path(client.download_artifacts(logger.run_id, reports[0], str(tmp_path / "r"))).read_text())
    jsonschema.validate(report, load_schema(), cls=jsonschema.Draft202012Validator)  # with the verdict and trust keys
    entry = {run["global_step"]: run for run in callback.history}[report["global_step"]]
    assert (report["verdict"]["accuracy"], report["verdict"]["trust"]) == (entry["verdict"], entry["trust"])
    assert report["epoch"] == entry["epoch"]  # the epoch its weights trained in, as the history and report_dir say
    assert report["trust"]["status"] == report["verdict"]["trust"] and set(report["trust"]["checks"]) == {
        "sanity",
        "faithfulness",
        "stability",
    }


def test_an_mlflow_store_that_refuses_the_report_is_said_once_and_training_goes_on(tmp_path, monkeypatch):
    # A remote artifact store that refuses a write (or a full disk) ended the fit with the logger's error
    logger_package("mlflow")
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow import MlflowClient

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setattr(MlflowClient, "log_text", refuse)
    uri = f"file:{tmp_path / 'mlruns'}"
    logger = MLFlowLogger(experiment_name="lightning-ig", tracking_uri=uri)
    callback = IntegratedGradientsCallback(frames(6, SHAPE, seed=2), every_n_steps=1, engine=IGOptions(n_steps=8))
    data = DataLoader(frame_dataset(32, SHAPE), batch_size=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback], max_steps=4, logger=logger).fit(ConvQNet(SHAPE), data)
    refused = [str(w.message) for w in caught if "refused" in str(w.message)]
    assert len(refused) == 1 and "MLFlowLogger" in refused[0] and "No space left" in refused[0], refused
    assert [run["global_step"] for run in callback.history] == [1, 2, 3, 4]  # every run made and kept
    pngs = mlflow_pictures(MlflowClient(tracking_uri=uri), logger.run_id)
    assert {step for _, step in pngs} >= {1, 4}  # the pictures of the run that failed, and of the last one


def test_a_wandb_offline_run_holds_the_pictures(tmp_path, monkeypatch):
    wandb = logger_package("wandb")  # the [wandb] extra, in the dev extra
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="lightning-ig-test")
    _fit(tmp_path, logger)
    files = Path(logger.experiment.dir)
    logger.experiment.finish()
    wandb.teardown()
    pictures = list((files / "media" / "images").rglob("*.png"))  # W&B's media folder, one file per picture
    assert len(pictures) >= len(FIRST_RUN)
    widths = {Image.open(path).size[0] for path in pictures}
    assert widths == {CARD_WIDTH}  # every picture drawn at the card's width
    assert list((files / "media" / "table").rglob("*.table.json"))  # the feature (group) table
