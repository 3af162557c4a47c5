"""A real TensorBoard server, started on 127.0.0.1, lists the callback's tags through its HTTP API."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from lightning_ig.attribution import IGOptions
from lightning_ig.callback import IntegratedGradientsCallback
from tests.support.tiny import (
    FEATURES,
    ConvQNet,
    TinyQNet,
    dataset,
    frame_dataset,
    frames,
    held_out_states,
)

STARTUP_SECONDS = 90


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read().decode())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("tb_server")
    pl.seed_everything(0)
    logger = TensorBoardLogger(root, name="tiny")
    callback = IntegratedGradientsCallback(
        held_out_states(), every_n_steps=5, feature_names=FEATURES, engine=IGOptions(n_steps=8)
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=10,
        logger=logger,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(TinyQNet(), DataLoader(dataset(), batch_size=16, shuffle=True))
    run = Path(logger.log_dir).relative_to(root).as_posix()  # the run's name in TensorBoard: "tiny/version_0"
    # a second run on image states: groups and saliency images
    image_logger = TensorBoardLogger(root, name="images")
    image_callback = IntegratedGradientsCallback(frames(8, (3, 16, 16)), every_n_steps=2, engine=IGOptions(n_steps=8))
    pl.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=image_logger,
        callbacks=[image_callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    ).fit(ConvQNet((3, 16, 16)), DataLoader(frame_dataset(32, (3, 16, 16)), batch_size=16))
    image_run = Path(image_logger.log_dir).relative_to(root).as_posix()

    port = _free_port()
    log = open(root / "tensorboard.log", "w")  # noqa: SIM115 - closed below, after the process
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(root),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast",
            "false",  # the pure-Python loader: the Rust data server is an optional extra
            "--reload_interval",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                output = (root / "tensorboard.log").read_text()[-3000:]
                raise AssertionError(f"tensorboard exited with {process.returncode}: {output}")
            try:
                tags = _get(f"{base}/data/plugin/scalars/tags")
                if all(name in tags and any(tag.startswith("ig/") for tag in tags[name]) for name in (run, image_run)):
                    break  # up, and the runs are loaded
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
                pass
            if time.monotonic() > deadline:
                output = (root / "tensorboard.log").read_text()[-3000:]
                raise AssertionError(f"tensorboard did not serve the run within {STARTUP_SECONDS} s: {output}")
            time.sleep(0.5)
        yield base, run, image_run
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def test_scalar_tags(server):
    base, run, *_ = server
    tags = _get(f"{base}/data/plugin/scalars/tags")[run]
    expected = {
        "ig/completeness/worst_attribution_error",
        "ig/completeness/worst_mass_relative_error",
        "ig/completeness/mean_abs_error",
        "ig/concentration/top1pct_share",
        "ig/time_ms",
        *(f"ig/mean_abs/{name}" for name in FEATURES),
        *(f"ig/mean_signed/{name}" for name in FEATURES),
    }
    assert expected <= set(tags)
    assert "ig/drift/topk_jaccard_prev" not in tags  # 4 features, top_k=10: the overlap is 1 by construction
    assert "ig/completeness/worst_relative_error" not in tags  # the old ratio: in the JSON report, never plotted
    # cards that carry nothing here: counts never non-zero; top-10% = top-1% with 4 features (issue 20 item 7)
    assert not {"ig/completeness/non_finite_states", "ig/completeness/degenerate_states"} & set(tags)
    assert "ig/concentration/top10pct_share" not in tags
    values = _get(f"{base}/data/plugin/scalars/scalars?run={run}&tag=ig/mean_abs/pole_theta")
    assert [step for _, step, _ in values] == [5, 10]


def test_histogram_image_and_text_tags(server):
    base, run, *_ = server
    histograms = _get(f"{base}/data/plugin/histograms/tags")[run]
    assert {f"ig/attributions/{name}" for name in FEATURES} <= set(histograms)
    images = _get(f"{base}/data/plugin/images/tags")[run]
    assert {"ig/0_verdict", "ig/1_over_training"} <= set(images)
    text = _get(f"{base}/data/plugin/text/tags")[run]
    assert "ig/report/text_summary" in text  # SummaryWriter.add_text("ig/report")
    # the text plugin renders the markdown; the top-k table is a fixed-width block with right-aligned numbers
    rendered = _get(f"{base}/data/plugin/text/text?run={run}&tag=ig/report/text_summary")
    assert rendered[-1]["step"] == 10
    assert "<pre>" in rendered[-1]["text"] and "pole_theta" in rendered[-1]["text"]
    assert "✓ The attributions add up" in rendered[-1]["text"]


def test_saliency_images_and_group_tags_of_an_image_run(server):
    base, _, run = server
    images = _get(f"{base}/data/plugin/images/tags")[run]
    assert "ig/2_saliency" in images
    listed = _get(f"{base}/data/plugin/images/images?run={run}&tag=ig/2_saliency")
    assert [entry["step"] for entry in listed] == [2]
    with urllib.request.urlopen(
        f"{base}/data/plugin/images/individualImage?{listed[-1]['query']}", timeout=5
    ) as response:
        assert response.read(8) == b"\x89PNG\r\n\x1a\n"
    scalars = _get(f"{base}/data/plugin/scalars/tags")[run]
    assert {f"ig/group/mean_abs/channel {c}" for c in range(3)} <= set(scalars)
    histograms = _get(f"{base}/data/plugin/histograms/tags")[run]
    assert {f"ig/group/attributions/channel {c}" for c in range(3)} <= set(histograms)
