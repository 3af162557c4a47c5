"""examples/dqn_minatar.py logging to W&B (offline) and to MLflow (a file store), end to end, read back.

Three tiny runs of the example in subprocesses, as a user types them, with one seed: ``WANDB_MODE=offline ...
--logger wandb``, ``--logger mlflow`` (the default tracking URI: a file store in the run folder) and ``--logger
tensorboard``. What each logger stored is read back from its own files with the real packages (the offline run's
``.wandb`` file and media folder; ``MlflowClient`` on the file store; TensorBoard's event file): every picture the
callback draws at its two picture steps, as PNGs of the card's width that decode to the same pixels in all three
loggers; the feature (channel) table; the JSON report (schema version 1, valid); the scalars.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("minatar", reason="the MinAtar example needs minatar (pip install 'lightning-ig[examples]')")

from lightning_ig.views.pictures.raster import CARD_WIDTH, png_bytes
from lightning_ig.views.report import load_schema
from lightning_ig.views.tags import PICTURE_TAGS
from tests.support.examples import REPO, example_env, load_example, only_run_dir
from tests.support.loggers import logger_package, mlflow_pictures, wandb_history, wandb_pictures

EXAMPLE = REPO / "examples" / "dqn_minatar.py"
CHANNEL_NAMES = ["paddle", "ball", "trail", "brick"]  # MinAtar Breakout's channels, in order
TINY = [
    *("--total-timesteps", "1200", "--learning-starts", "400", "--num-envs", "4", "--batch-size", "32"),
    *("--ig-every-n-steps", "100", "--ig-n-steps", "8", "--num-held-out", "8", "--ig-overhead", "none"),
    *("--eval-episodes", "2", "--random-episodes", "4", "--no-progress-bar", "--accelerator", "cpu", "--seed", "3"),
]
# (1200 - 400) / 4 = 200 gradient steps, an IG run every 100: pictures at the first run and at the end
PICTURE_STEPS = (100, 200)
# Every kind of picture V(s) of frames gets (the why-this-action picture is for target="each" or "contrast")
PICTURES = {f"ig/{tag}" for kind, tag in PICTURE_TAGS.items() if kind != "actions"}

pytestmark = pytest.mark.slow


def _run(logger: str, workdir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The example with ``--logger logger`` in ``workdir``; W&B's and MLflow's own folders kept inside it."""
    environment = example_env()
    for name in ("WANDB_MODE", "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):  # the example's defaults, tested
        environment.pop(name, None)
    environment.update(
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(workdir / "wandb-config"),
        WANDB_CACHE_DIR=str(workdir / "wandb-cache"),
        WANDB_DATA_DIR=str(workdir / "wandb-data"),
        WANDB_ERROR_REPORTING="false",
        MLFLOW_DISABLE_TELEMETRY="true",
        **env,
    )
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *TINY, "--logger", logger, "--runs-dir", "runs"],
        cwd=workdir,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def _rgb(source: object) -> np.ndarray:
    """A stored picture decoded as ``(H, W, 3)`` uint8, after checking that it is a PNG."""
    image = Image.open(source)
    assert image.format == "PNG", image.format
    return np.asarray(image.convert("RGB"))


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The run's stdout and its offline run folder (``runs/<run>/wandb/offline-run-<time>-<id>``)."""
    logger_package("wandb")  # the [wandb] extra, in the dev extra
    workdir = tmp_path_factory.mktemp("minatar-wandb")
    proc = _run("wandb", workdir, WANDB_MODE="offline")  # as the README says: no account, no network
    _ok(proc)
    (offline_run,) = (only_run_dir(workdir / "runs") / "wandb").glob("offline-run-*")
    return proc, offline_run


@pytest.fixture(scope="module")
def mlflow_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.CompletedProcess[str], object]]:
    """The run's stdout and the ``MlflowClient`` run of the file store in its run folder."""
    logger_package("mlflow")  # the [mlflow] extra, in the dev extra
    from mlflow import MlflowClient

    workdir = tmp_path_factory.mktemp("minatar-mlflow")
    proc = _run("mlflow", workdir)
    _ok(proc)
    store = only_run_dir(workdir / "runs") / "mlruns"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # reading the store, here as in the example
        client = MlflowClient(tracking_uri=store.resolve().as_uri())
        experiment = client.get_experiment_by_name("dqn_minatar")  # --exp-name's default
        assert experiment is not None, [e.name for e in client.search_experiments()]
        (run,) = client.search_runs([experiment.experiment_id])
        yield proc, client, run


@pytest.fixture(scope="module")
def tensorboard_pictures(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], np.ndarray]:
    """Every picture of the same run logged to TensorBoard (``--logger tensorboard``), decoded, by (tag, step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    workdir = tmp_path_factory.mktemp("minatar-tensorboard")
    proc = _run("tensorboard", workdir)
    _ok(proc)
    accumulator = EventAccumulator(str(only_run_dir(workdir / "runs")), size_guidance={"images": 0})
    accumulator.Reload()
    return {
        (tag, event.step): _rgb(io.BytesIO(event.encoded_image_string))
        for tag in accumulator.Tags()["images"]
        for event in accumulator.Images(tag)
    }


def _wandb_decoded(offline_run: Path) -> dict[tuple[str, int], np.ndarray]:
    decoded = {}
    for key, entry in wandb_pictures(offline_run).items():
        pixels = _rgb(entry["path"])
        assert pixels.shape[:2] == (entry["height"], entry["width"]), (key, pixels.shape, entry)
        decoded[key] = pixels
    return decoded


def _mlflow_decoded(client, run, target: Path) -> dict[tuple[str, int], np.ndarray]:
    """MLflow's pictures by (tag, step): each at its run's step, and a tag's first also at step 0 (where MLflow's UI
    opens an image card): that copy is checked here and left out."""
    decoded = {
        key: _rgb(client.download_artifacts(run.info.run_id, path, str(target)))
        for key, path in mlflow_pictures(client, run.info.run_id).items()
    }
    for tag in PICTURES:
        assert np.array_equal(decoded.pop((tag, 0)), decoded[tag, PICTURE_STEPS[0]]), tag
    return decoded


def _check_pictures(decoded: dict[tuple[str, int], np.ndarray]) -> None:
    assert set(decoded) == {(tag, step) for tag in PICTURES for step in PICTURE_STEPS}, sorted(decoded)
    for key, pixels in decoded.items():
        assert pixels.shape[1] == CARD_WIDTH and pixels.shape[0] > 0, (key, pixels.shape)  # the card's width
        assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 2, f"{key} is blank"


def _check_table(columns: list[str], rows: list[list], report: dict, decimals: int | None = None) -> None:
    """The channel table: every channel once, ranked by its share of the mass (the verdict card's order), split into
    what raises and what lowers V(s), with the report's groups' mean |attr| (exactly, or as rounded to ``decimals``
    places by the writer of the table)."""
    assert columns[:6] == ["rank", "name", "share", "raises", "lowers", "mean |attr|"], columns
    names, shares, mean_abs = [row[1] for row in rows], [row[2] for row in rows], [row[5] for row in rows]
    assert sorted(names) == sorted(CHANNEL_NAMES)
    assert shares == sorted(shares, reverse=True) and abs(sum(shares) - 1) <= 1e-9
    by_name = {group["name"]: group["mean_abs"] for group in report["groups"]}
    for name, value in zip(names, mean_abs):
        rounding = 0.0 if decimals is None else 0.5 * 10.0**-decimals + float(np.spacing(by_name[name]))
        assert abs(value - by_name[name]) <= rounding, (name, value, by_name[name])


def _check_report(report: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(report, load_schema())
    assert report["schema_version"] == 1
    assert [group["name"] for group in report["groups"]] == CHANNEL_NAMES
    assert report["num_states"] == 8 and report["state_dim"] == 4 * 10 * 10
    assert (
        report["verdict"]["accuracy"] in ("pass", "fail", "unchecked", "non-finite")
        and report["verdict"]["trust"] is None
    )  # --ig-overhead none: no trust checks


def test_the_wandb_offline_run_holds_every_picture_at_each_picture_step(wandb_run) -> None:
    _, offline_run = wandb_run
    _check_pictures(_wandb_decoded(offline_run))


def test_the_wandb_offline_run_holds_the_channel_table_the_report_and_the_scalars(wandb_run) -> None:
    _, offline_run = wandb_run
    files = offline_run / "files"
    reports = sorted((files / "ig").glob("report_step=*.json"))
    # with each bar chart: the first run's, and the last run's, drawn when training ends
    assert [path.name for path in reports] == [f"report_step={step:08d}.json" for step in PICTURE_STEPS], reports
    for path in reports:
        _check_report(json.loads(path.read_text()))
    first_report = json.loads(reports[0].read_text())
    tables = sorted(
        (files / "media" / "table" / "ig").glob("groups_*.table.json"), key=lambda path: path.stat().st_mtime
    )
    assert len(tables) == len(PICTURE_STEPS), tables  # with each bar chart, as the reports
    table = json.loads(tables[0].read_text())  # the first bar chart's
    rows = table["data"]
    _check_table(table["columns"], rows, first_report)
    rows_by_step: dict[int, set[str]] = {}
    for row in wandb_history(next(offline_run.glob("run-*.wandb"))):
        if "trainer/global_step" in row:
            rows_by_step.setdefault(int(row["trainer/global_step"]), set()).update(row)
    for step in PICTURE_STEPS:
        assert {f"ig/group/mean_abs/{name}" for name in CHANNEL_NAMES} <= rows_by_step[step], sorted(rows_by_step)
    assert "eval/mean_return" in rows_by_step[200]  # the example's own metrics, to the same logger


def test_the_mlflow_file_store_holds_every_picture_at_each_picture_step(mlflow_run, tmp_path: Path) -> None:
    _, client, run = mlflow_run
    _check_pictures(_mlflow_decoded(client, run, tmp_path))


def test_the_mlflow_file_store_holds_the_table_the_report_the_scalars_and_the_flags(mlflow_run, tmp_path) -> None:
    _, client, run = mlflow_run
    run_id = run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name.startswith("MinAtar-breakout__dqn_minatar__3__")
    stored = sorted(info.path for info in client.list_artifacts(run_id, "lightning_ig/ig"))
    reports = [path for path in stored if path.rsplit("/", 1)[-1].startswith("report_step=")]
    assert reports == [f"lightning_ig/ig/report_step={step:08d}.json" for step in PICTURE_STEPS], stored
    for path in reports:
        _check_report(json.loads(Path(client.download_artifacts(run_id, path, str(tmp_path))).read_text()))
    first_report = json.loads(Path(client.download_artifacts(run_id, reports[0], str(tmp_path))).read_text())
    table_file = client.download_artifacts(run_id, "lightning_ig/ig/groups/step_00000100.json", str(tmp_path))
    table = json.loads(Path(table_file).read_text())
    rows = table["data"]
    # MLflow's log_table writes through pandas' to_json, 10 decimal places (the JSON report keeps every digit)
    _check_table(table["columns"], rows, first_report, decimals=10)
    for name in CHANNEL_NAMES:
        history = client.get_metric_history(run_id, f"ig/group/mean_abs/{name}")
        assert [metric.step for metric in history] == list(PICTURE_STEPS)
    assert [metric.step for metric in client.get_metric_history(run_id, "eval/mean_return")] == [200]
    assert run.data.params["logger"] == "mlflow" and run.data.params["seed"] == "3"  # the command line


def test_every_logger_holds_the_same_pictures_as_tensorboard(wandb_run, mlflow_run, tensorboard_pictures, tmp_path):
    _, offline_run = wandb_run
    _, client, run = mlflow_run
    _check_pictures(tensorboard_pictures)  # TensorBoard's pictures, as with no other logger
    wandb_pixels, mlflow_pixels = _wandb_decoded(offline_run), _mlflow_decoded(client, run, tmp_path)
    for key, pixels in tensorboard_pictures.items():  # one seed, bit-identical training: the same pictures
        assert np.array_equal(wandb_pixels[key], mlflow_pixels[key]), f"W&B's {key} differs from MLflow's"
        # W&B and MLflow keep every colour; TensorBoard gets the same pixels as a palette PNG of at most 256
        assert np.array_equal(_rgb(io.BytesIO(png_bytes(wandb_pixels[key]))), pixels), f"{key} differs from TB's"


def test_the_example_says_where_each_run_is_and_writes_no_tensorboard_file_beside(wandb_run, mlflow_run) -> None:
    proc, offline_run = wandb_run
    run_dir = offline_run.parent.parent
    assert f"wandb sync {Path('runs', run_dir.name, 'wandb', offline_run.name)}" in proc.stdout
    assert not list(run_dir.glob("events.out.tfevents.*"))
    assert (run_dir / "q_network.safetensors").is_file()  # the checkpoint in the same run folder
    proc, _, run = mlflow_run
    line = next(line for line in proc.stdout.splitlines() if line.startswith("mlflow "))
    assert line.split()[1] == "MLFLOW_ALLOW_FILE_STORE=true" and line.split()[3:5] == ["ui", "--backend-store-uri"]
    assert Path(line.split()[2]).name == "mlflow"  # the mlflow beside this interpreter, or on the PATH
    store = Path(line.rsplit("file://", 1)[1])
    assert (store / run.info.experiment_id / run.info.run_id).is_dir()
    assert not list(store.parent.glob("events.out.tfevents.*"))


@pytest.fixture
def example_module() -> ModuleType:
    return load_example(EXAMPLE, "dqn_minatar_loggers_example")


def test_help_names_the_loggers(example_module, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        example_module.parse_args(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--logger {tensorboard,wandb,mlflow}" in text and "(default: tensorboard)" in text
    assert "WANDB_MODE=offline" in text
    assert "--wandb-project WANDB_PROJECT the W&B project of the run (--logger wandb) (default: lightning-ig)" in text
    assert "default: a file store in runs/<run>/mlruns" in text


@pytest.mark.parametrize("logger", ["wandb", "mlflow"])
def test_a_logger_without_its_package_exits_2_naming_the_extra(example_module, logger, monkeypatch, capsys) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == logger else find_spec(name))
    with pytest.raises(SystemExit) as exit_info:
        example_module.parse_args(["--logger", logger])
    assert exit_info.value.code == 2
    assert (
        f"--logger {logger} needs the {logger} package: pip install 'lightning-ig[{logger}]'" in capsys.readouterr().err
    )
