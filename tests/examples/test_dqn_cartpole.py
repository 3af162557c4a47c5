"""End to end: examples/dqn_cartpole.py with tiny settings, through a subprocess as a user runs it.

One short training run (a few hundred steps, the IG callback on) is shared by
the tests: it must exit 0, leave the ``ig/`` tags in its TensorBoard folder,
and a checkpoint that :func:`lightning_ig.checkpoint.load_checkpoint` rebuilds
and ``lightning-ig diag --states auto`` turns into a valid report. A second run
with the same seed and the callback off must give bit-identical weights
(seeded CPU runs repeat, and the callback leaves training alone).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("gymnasium", reason="the example needs gymnasium (pip install 'lightning-ig[examples]')")

from lightning_ig.checkpoint import load_checkpoint
from lightning_ig.models import DuelingQNetwork
from lightning_ig.views.report import load_schema
from lightning_ig.views.tags import display_labels
from tests.support.examples import (
    REPO,
    SHARED_BAD_FLAGS,
    STOPS,
    assert_gpu_refused_without_a_gpu,
    assert_mlflow_logger_starts_quietly,
    assert_mlflow_refuses_exp_name,
    assert_mlflow_refusing_is_not_unreachable,
    assert_mlflow_takes_a_plain_path,
    assert_mlflow_unreachable_says_so,
    assert_refused_at_parse,
    assert_wandb_without_login_says_what_to_do,
    example_env,
    load_example,
    stopped_in_evaluation,
)
from tests.support.examples import only_run_dir as _only_run_dir
from tests.support.examples import run_python as _run

EXAMPLE = REPO / "examples" / "dqn_cartpole.py"
FEATURE_NAMES = ["cart position", "cart velocity", "pole angle", "pole angular velocity"]
NUM_HELD_OUT = 32
TINY = [
    "--total-timesteps",
    "500",
    "--learning-starts",
    "200",
    "--batch-size",
    "32",
    *("--ig-overhead", "none"),  # a tiny fit: every run at its step, whatever the machine's speed
    "--ig-every-n-steps",
    "100",
    "--ig-n-steps",
    "16",
    "--num-held-out",
    str(NUM_HELD_OUT),
    "--eval-episodes",
    "2",
    "--no-progress-bar",
    "--seed",
    "3",  # no --accelerator: the example picks the CPU
    "--fused-loss",  # the package's loss as the auxiliary loss: its torch twin on the CPU
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    workdir = tmp_path_factory.mktemp("example")
    proc = _run([str(EXAMPLE), *TINY, "--runs-dir", "runs"], cwd=workdir)
    return proc, workdir / "runs"


def test_exits_zero_and_prints_the_summary(tiny_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, runs = tiny_run
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "eval return         mean" in proc.stdout
    assert "top features by mean |attribution|" in proc.stdout
    assert "auxiliary loss      lightning-ig fused soft-margin" in proc.stdout
    assert "device              cpu" in proc.stdout
    for name in FEATURE_NAMES:
        assert name in proc.stdout
    run_dir = _only_run_dir(runs)
    assert run_dir.name.startswith("CartPole-v1__dqn_cartpole__3__")
    for noise in ("Tip:", "GPU available", "LeafSpec"):  # third parties' words, not the run's: silenced
        assert noise not in proc.stderr, proc.stderr[-2000:]


def test_the_printed_diag_command_runs_as_printed(
    tiny_run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    # guards against: a bare `lightning-ig`, not on the PATH after the README's commands (they never activate the venv)
    proc, _ = tiny_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("diagnose it with"))
    command = shlex.split(line.removeprefix("diagnose it with"))
    assert Path(command[0]).name in ("lightning-ig", Path(sys.executable).name), command
    # the report goes to the run's folder: the README's lines, one example after the other, never meet at one name
    assert command[-2:] == [
        "--output",
        str(_only_run_dir(tiny_run[1]).relative_to(tiny_run[1].parent) / "ig_report.json"),
    ]
    for _ in range(2):  # named with --output: run again, it replaces its own report
        done = subprocess.run(
            [*command, "--auto-samples", "4"],
            cwd=tiny_run[1].parent,
            env=example_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tiny_run[1].parent / command[-1]).read_text())
    # the run's --ig-n-steps 16, not diag's default 'auto': its figures are the closing lines'
    assert (report["num_states"], report["num_steps"]) == (4, 16)


def test_tensorboard_folder_holds_the_ig_tags(tiny_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc, runs = tiny_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    accumulator = EventAccumulator(str(_only_run_dir(runs)), size_guidance={"scalars": 0, "images": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = set(tags["scalars"])
    expected = {
        "ig/completeness/worst_attribution_error",
        "ig/completeness/mean_abs_error",
        "ig/time_ms",
        "charts/episodic_return",
        "losses/td_loss",
        "eval/mean_return",
    }
    for tag in display_labels(FEATURE_NAMES):
        expected |= {f"ig/mean_abs/{tag}", f"ig/mean_signed/{tag}"}
    assert expected <= scalars, f"missing scalar tags: {sorted(expected - scalars)}"
    # 300 gradient steps, a run every 100 steps (the one at the end is the run at step 300)
    assert [e.step for e in accumulator.Scalars("ig/completeness/worst_attribution_error")] == [100, 200, 300]
    assert {f"ig/attributions/{tag}" for tag in display_labels(FEATURE_NAMES)} <= set(tags["histograms"])
    assert "ig/0_verdict" in tags["images"]
    assert "hyperparameters/text_summary" in tags["tensors"]


def test_a_wandb_offline_run_holds_the_bar_chart_and_the_report(tmp_path: Path) -> None:
    # --logger wandb as the README writes it (WANDB_MODE=offline: no account, no network); the MinAtar example's
    # test reads W&B and MLflow back in full (tests/examples/test_dqn_minatar_loggers.py)
    from PIL import Image

    from lightning_ig.views.pictures.raster import CARD_WIDTH
    from tests.support.loggers import logger_package, wandb_pictures

    logger_package("wandb")  # the [wandb] extra, in the dev extra

    env = example_env()
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wandb-data"),
        WANDB_ERROR_REPORTING="false",
    )
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *TINY, "--logger", "wandb", "--runs-dir", "runs"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    run_dir = _only_run_dir(tmp_path / "runs")
    (offline_run,) = (run_dir / "wandb").glob("offline-run-*")
    assert f"wandb sync {Path('runs', run_dir.name, 'wandb', offline_run.name)}" in proc.stdout
    pictures = wandb_pictures(offline_run)
    # 300 gradient steps, a run every 100: pictures at the first run and at the end; features, no frames
    # the shares at the first run and the end; the verdict card also at a run whose verdict changed (step 200)
    assert {step for tag, step in pictures if tag == "ig/1_over_training"} == {100, 300}
    assert {100, 300} <= {step for tag, step in pictures if tag == "ig/0_verdict"} <= {100, 200, 300}
    assert {tag for tag, _ in pictures} == {"ig/0_verdict", "ig/1_over_training"}
    for key, entry in pictures.items():
        image = Image.open(entry["path"])
        assert image.format == "PNG" and image.size == (entry["width"], entry["height"]), (key, image.size)
        assert image.size[0] == CARD_WIDTH
    report = json.loads((offline_run / "files" / "ig" / "report_step=00000100.json").read_text())
    assert report["schema_version"] == 1 and [f["name"] for f in report["features"]] == FEATURE_NAMES


@pytest.mark.parametrize("activation", ["tanh", "relu"])  # the default, and the network users train
def test_trains_and_checkpoints_with_each_activation(
    activation: str, tiny_run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    if activation == "tanh":  # the default: the shared run
        proc, runs = tiny_run
    else:
        flags = [*TINY, "--total-timesteps", "300", "--activation", activation]  # the later flag wins
        proc, runs = _run([str(EXAMPLE), *flags, "--runs-dir", "runs"], cwd=tmp_path), tmp_path / "runs"
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    verdict = next(line for line in proc.stdout.splitlines() if line.startswith("IG verdict "))
    assert re.search(r", at step [\d,]+$", verdict) and verdict.split()[2] in ("✓", "✗", "?")  # the last run's
    loaded = load_checkpoint(_only_run_dir(runs) / "q_network.safetensors")
    assert loaded.model.config()["activation"] == activation
    q_values = loaded.model.eval()(loaded.states)
    assert torch.isfinite(q_values).all()


def test_checkpoint_loads_with_states_and_names(tiny_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, runs = tiny_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = load_checkpoint(_only_run_dir(runs) / "q_network.safetensors")
    assert isinstance(loaded.model, DuelingQNetwork)
    assert loaded.feature_names == FEATURE_NAMES
    assert loaded.states is not None and tuple(loaded.states.shape) == (NUM_HELD_OUT, 4)
    assert torch.isfinite(loaded.states).all()
    assert loaded.metadata["env_id"] == "CartPole-v1"
    assert float(loaded.metadata["eval_mean_return"]) >= 8  # CartPole's shortest possible episode
    q_values = loaded.model.eval()(loaded.states)
    assert q_values.shape == (NUM_HELD_OUT, 2) and torch.isfinite(q_values).all()


def test_diag_on_the_checkpoint_writes_a_valid_report(
    tiny_run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    proc, runs = tiny_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = tmp_path / "report.json"
    checkpoint = _only_run_dir(runs) / "q_network.safetensors"
    diag = _run(
        [
            "-m",
            "lightning_ig.cli",
            "diag",
            "--checkpoint",
            str(checkpoint),
            "--states",
            "auto",
            "--auto-samples",
            "8",
            "--output",
            str(output),
        ],
        cwd=tmp_path,
        timeout=120,
    )
    assert diag.returncode == 0, f"stdout:\n{diag.stdout[-2000:]}\nstderr:\n{diag.stderr[-2000:]}"
    report = json.loads(output.read_text())
    jsonschema.validate(report, load_schema())
    assert report["schema_version"] == 1
    assert report["num_states"] == 8 and report["state_dim"] == 4
    assert [feature["name"] for feature in report["features"]] == FEATURE_NAMES


def test_same_seed_same_weights_with_or_without_the_callback(
    tiny_run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    proc, runs = tiny_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = _run([str(EXAMPLE), *TINY, "--no-ig", "--runs-dir", "runs"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    first = load_checkpoint(_only_run_dir(runs) / "q_network.safetensors")
    second = load_checkpoint(_only_run_dir(tmp_path / "runs") / "q_network.safetensors")
    first_state, second_state = first.model.state_dict(), second.model.state_dict()
    assert first_state.keys() == second_state.keys()
    for name, tensor in first_state.items():
        assert torch.equal(tensor, second_state[name]), f"{name} differs between two runs with seed 3"
    assert torch.equal(first.states, second.states)
    assert first.metadata["eval_mean_return"] == second.metadata["eval_mean_return"]


def test_help_shows_each_flag_with_its_help_and_default(tmp_path: Path) -> None:
    proc = _run([str(EXAMPLE), "--help"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    assert "--fused-loss, --no-fused-loss" in text
    assert (
        "--learning-starts LEARNING_STARTS environment steps with random actions that fill the replay buffer first "
        "(default: 1000)"
    ) in text
    assert "--accelerator {cpu,gpu,auto}" in text
    assert "(default: None)" not in text  # a flag without a default shows none
    # each default said once, by the formatter: --ig-overhead's help also wrote "(default 0.02)" before it
    assert "(default 0.02)" not in text and "(default: 0.02)" in text
    assert "1e-4" not in text  # the activation's help says what is measured, not a number the run does not print


def test_help_answers_before_torch_lightning_and_gymnasium_are_imported(tmp_path: Path) -> None:
    proc = _run(["-X", "importtime", str(EXAMPLE), "--help"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "--total-timesteps" in proc.stdout, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")}
    assert not imported & {"torch", "lightning", "gymnasium", "lightning_ig"}, sorted(imported)[:20]


@pytest.mark.parametrize(("given", "parsed"), [("auto", "auto"), ("budget", "budget"), ("12", 12)])
def test_ig_n_steps_takes_what_the_library_takes(example_module: ModuleType, given: str, parsed: int | str) -> None:
    assert example_module.parse_args(["--ig-n-steps", given]).ig_n_steps == parsed


def test_two_runs_started_in_the_same_second_get_a_folder_each(example_module: ModuleType, tmp_path: Path) -> None:
    name = "CartPole-v1__dqn_cartpole__1__1796119555"
    first, second = (example_module.new_run_dir(str(tmp_path / "runs"), name) for _ in range(2))
    assert (first.name, second.name) == (name, f"{name}-2") and first.is_dir() and second.is_dir()


def test_bad_flag_exits_2_with_a_message(tmp_path: Path) -> None:
    proc = _run([str(EXAMPLE), "--no-such-flag"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "error: unrecognized arguments: --no-such-flag" in proc.stderr
    assert not (tmp_path / "runs").exists(), "a rejected command line must not start a run"


@pytest.fixture(scope="module")
def example_module() -> ModuleType:
    return load_example(EXAMPLE, "dqn_cartpole_example")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
        (["--total-timesteps", "lots"], "argument --total-timesteps: invalid int value: 'lots'"),
        (["--accelerator", "tpu"], "--accelerator: invalid choice: 'tpu'"),
        (["--gamma", "1.5"], "--gamma must be in (0, 1], got 1.5"),
        # fewer random steps than one n-step window leave the replay empty: it crashed at the first sample
        (["--learning-starts", "0"], "--learning-starts must be at least 3 with --n-step 3"),
        (["--learning-starts", "4", "--n-step", "5"], "--learning-starts must be at least 5 with --n-step 5"),
        (["--learning-rate", "inf"], "argument --learning-rate: must be a finite number, got inf"),
        (["--gamma", "nan"], "argument --gamma: must be a finite number, got nan"),
        (["--tau", "NaN"], "argument --tau: must be a finite number, got NaN"),
        (["--ig-overhead", "nan"], "argument --ig-overhead: must be in (0, 1] or 'none', got nan"),
        (["--ig-n-steps", "-3"], "--ig-n-steps: must be a whole number >= 1, 'budget' or 'auto', got '-3'"),
        # the example reads CartPole's four features: anything else failed after the run folder was made
        (["--env-id", "Acrobot-v1"], "--env-id Acrobot-v1 is not supported: the example reads CartPole's four"),
        (["--env-id", "Nope-v0"], "--env-id Nope-v0: no such Gymnasium environment"),
        *SHARED_BAD_FLAGS,
    ],
)
def test_bad_value_exits_2_with_a_message(
    example_module: ModuleType, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_refused_at_parse(example_module, flags, message, capsys)


@pytest.mark.parametrize("name", ["it's mine", ""])
def test_an_experiment_name_mlflow_refuses_exits_2(
    example_module: ModuleType, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: MLflow's experiment search failed on a quote (and refuses an empty name) after the run folder
    # was made
    assert_mlflow_refuses_exp_name(example_module, name, capsys)


def test_the_edges_of_the_ranges_are_taken(example_module: ModuleType) -> None:
    # the smallest warm-up that fills the replay (one n-step window), seed_everything's largest seed, CartPole-v0
    assert example_module.parse_args(["--learning-starts", "3"]).learning_starts == 3
    assert example_module.parse_args(["--seed", "4294967295"]).seed == 2**32 - 1
    assert example_module.parse_args(["--env-id", "CartPole-v0"]).env_id == "CartPole-v0"
    assert example_module.parse_args(["--exp-name", "it's mine"]).exp_name == "it's mine"
    assert example_module.parse_args(["--ig-n-steps", "64"]).ig_n_steps == 64


def test_the_printed_commands_are_shell_quoted(example_module: ModuleType, tmp_path: Path) -> None:
    # guards against: a --runs-dir with a space or an --exp-name with a quote broke the printed commands; a run with
    # fewer held-out states than diag samples by default (16) printed a diag command that diag refused
    from lightning_ig.cli.parser import build_parser

    run_dir = tmp_path / "my runs" / "CartPole-v1__it's mine__1__1796119555"
    checkpoint, output = run_dir / "q_network.safetensors", run_dir / "ig_report.json"
    words = shlex.split(example_module.diag_command(checkpoint, 8, output))
    assert words[words.index("--checkpoint") + 1] == str(checkpoint)
    assert words[words.index("--auto-samples") + 1] == "8"
    assert words[-2:] == ["--output", str(output)]
    parsed = build_parser().parse_args(words[words.index("diag") :])  # as lightning-ig reads it
    assert (parsed.checkpoint, parsed.auto_samples, parsed.output) == (str(checkpoint), 8, str(output))
    # as many stored as diag samples: its default; more: all of them, as the closing lines read them
    assert "--auto-samples" not in shlex.split(example_module.diag_command(checkpoint, 16, output))
    assert "--auto-samples 256 " in example_module.diag_command(checkpoint, 256, output)
    contrast = shlex.split(example_module.diag_command(checkpoint, 16, output, "contrast"))
    assert (
        build_parser().parse_args(contrast[contrast.index("diag") :]).target == "contrast" and parsed.target == "mean"
    )
    # guards against: a run on a GPU printing a line that runs diag on the CPU (its default --device), whose
    # n_steps="budget" picks the CPU's points and rule, so the report's figures were not the closing lines'
    on_gpu = shlex.split(example_module.diag_command(checkpoint, 256, output, "mean", "budget", "cuda:0"))
    parsed_gpu = build_parser().parse_args(on_gpu[on_gpu.index("diag") :])
    assert (parsed_gpu.device, parsed_gpu.num_steps, parsed.device) == ("cuda:0", "budget", "cpu")
    assert "--device" not in example_module.diag_command(checkpoint, 256, output, "mean", "auto", "cpu")

    from lightning.pytorch.loggers import TensorBoardLogger

    runs = tmp_path / "my runs"
    args = example_module.parse_args(["--runs-dir", str(runs)])
    logger = TensorBoardLogger(save_dir=runs, name="run", version="", default_hp_metric=False)
    words = shlex.split(example_module.close_logger(logger, args, run_dir))
    assert Path(words[0]).name == "tensorboard" and words[1:] == ["--logdir", str(runs)]


def test_a_run_that_diverged_prints_its_attributions_as_not_finite(example_module: ModuleType) -> None:
    # guards against: feature_statistics' None for a NaN attribution crashed the summary (-None)
    from lightning_ig.views import feature_statistics

    attributions = torch.tensor([[1.0, float("nan"), -2.0, 0.5], [3.0, 1.0, 2.0, -0.5]])
    features = feature_statistics(attributions, FEATURE_NAMES)
    ranked = example_module.ranked_features(features, 4)
    # by mean |attribution|, ties in order; cart velocity, with no finite one, last
    assert [feature["name"] for feature in ranked] == [
        "cart position",
        "pole angle",
        "pole angular velocity",
        "cart velocity",
    ]
    assert example_module.number(ranked[-1]["mean_abs"], ".4f") == "n/a (NaN/Inf)"
    assert example_module.number(float("inf"), "+.4f") == "n/a (NaN/Inf)"
    assert example_module.number(-0.5, "+.4f") == "-0.5000"  # a finite one as before


def test_a_diverged_run_saves_its_checkpoint_and_says_so(tmp_path: Path) -> None:
    # guards against: the summary crashed on the NaN attributions of a run that diverged, before the checkpoint was
    # saved, so nothing was left to diagnose
    flags = ["--total-timesteps", "400", "--learning-starts", "100", "--learning-rate", "1e30", "--no-anneal-lr"]
    quick = ["--num-held-out", "8", "--ig-n-steps", "16", "--eval-episodes", "1", "--no-progress-bar", "--seed", "1"]
    proc = _run([str(EXAMPLE), *flags, *quick, "--runs-dir", "runs"], cwd=tmp_path)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "mean |attr| n/a (NaN/Inf)   mean signed n/a (NaN/Inf)" in proc.stdout
    assert (_only_run_dir(tmp_path / "runs") / "q_network.safetensors").is_file()


@pytest.fixture
def quiet_main(example_module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The example with ``main``'s process-wide settings (torch's threads, the global seeds, log filters) left alone."""
    monkeypatch.setattr(example_module.torch, "set_num_threads", lambda threads: None)
    monkeypatch.setattr(example_module.L, "seed_everything", lambda *args, **kwargs: None)
    monkeypatch.setattr(example_module, "quiet_third_parties", lambda: None)
    return example_module


@pytest.mark.parametrize(("error", "status", "how"), STOPS)
def test_a_run_that_fails_after_its_folder_is_made_says_so(
    quiet_main: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: BaseException,
    status: int | None,
    how: str,
) -> None:
    # guards against: a traceback and a half-written run folder that looked like a run's; Lightning's SIGTERM (a
    # SystemExit without a code) exiting 0, silently, as if the run had finished
    def fail(*args: object) -> None:
        raise error

    monkeypatch.setattr(quiet_main, "make_logger", fail)
    with pytest.raises(type(error) if isinstance(error, RuntimeError) else SystemExit) as raised:
        quiet_main.main(["--runs-dir", str(tmp_path / "runs")])
    assert status is None or raised.value.code == status
    run_dir = _only_run_dir(tmp_path / "runs")
    assert (
        f"dqn_cartpole.py: the run {how}: {run_dir} holds only what it wrote before the error, no checkpoint"
    ) in capsys.readouterr().err


def test_a_run_stopped_in_its_evaluation_keeps_its_checkpoint(
    quiet_main: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: Ctrl-C during the closing evaluation losing the trained network (it was saved after it)
    metadata = stopped_in_evaluation(quiet_main, TINY, tmp_path / "runs", monkeypatch, capsys)
    assert metadata["global_step"] == "300" and metadata["env_id"] == "CartPole-v1"


def test_a_run_folder_that_cannot_be_made_is_one_line(
    quiet_main: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    runs.write_text("a file where the runs would go")
    with pytest.raises(SystemExit) as exit_info:
        quiet_main.main(["--runs-dir", str(runs)])
    assert exit_info.value.code == 2
    assert f"dqn_cartpole.py: error: cannot make the run folder under --runs-dir {runs}: it is not a folder" in (
        capsys.readouterr().err
    )


def test_defaults_and_boolean_flags(example_module: ModuleType) -> None:
    args = example_module.parse_args([])
    assert (args.seed, args.total_timesteps, args.batch_size, args.n_step) == (1, 25_000, 128, 3)
    assert args.accelerator is None  # not asked: the example chooses (the CPU)
    assert args.fused_loss is None  # fused on a CUDA device, torch's loss on the CPU
    assert example_module.parse_args(["--fused-loss"]).fused_loss is True
    changed = example_module.parse_args(["--no-fused-loss", "--no-ig", "--seed", "7"])
    assert (changed.fused_loss, changed.ig, changed.seed) == (False, False, 7)


@pytest.mark.parametrize(
    ("requested", "cuda_available", "accelerator", "said"),
    [
        (None, True, "cpu", "a GPU is visible, but this small network trains faster on the CPU"),
        (None, False, "cpu", "cpu"),
        ("gpu", True, "gpu", "gpu (--accelerator gpu)"),
        ("cpu", True, "cpu", "cpu (--accelerator cpu)"),
        ("auto", True, "auto", "auto (--accelerator auto)"),
    ],
)
def test_the_cpu_is_chosen_unless_a_device_is_asked_for(
    example_module: ModuleType, requested: str | None, cuda_available: bool, accelerator: str, said: str
) -> None:
    chosen, line = example_module.choose_accelerator(requested, cuda_available)
    assert chosen == accelerator
    assert line.startswith(accelerator) and said in line


def test_trainer_uses_the_cpu_by_default_even_with_a_gpu_visible(
    example_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning.pytorch.accelerators import CPUAccelerator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    trainer = example_module.make_trainer(example_module.parse_args(["--no-progress-bar"]), False, [])
    assert isinstance(trainer.accelerator, CPUAccelerator)


@pytest.mark.gpu
def test_runs_on_the_gpu_with_the_fused_loss_by_default(tmp_path: Path) -> None:
    # the tiny run on the GPU, with the loss left at its default
    gpu_flags = [flag for flag in TINY if flag != "--fused-loss"]
    proc = _run([str(EXAMPLE), *gpu_flags, "--accelerator", "gpu", "--runs-dir", "runs"], cwd=tmp_path)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "auxiliary loss      lightning-ig fused soft-margin" in proc.stdout  # the default on a CUDA device
    loaded = load_checkpoint(_only_run_dir(tmp_path / "runs") / "q_network.safetensors")
    assert loaded.states is not None and tuple(loaded.states.shape) == (NUM_HELD_OUT, 4)
    assert all(tensor.device.type == "cpu" for tensor in loaded.model.state_dict().values())


@pytest.mark.parametrize("target", ["mean", "each", "contrast"])
def test_ig_target_reaches_the_callback_with_the_action_names(example_module: ModuleType, target: str) -> None:
    args = example_module.parse_args(["--ig-target", target])
    callback = example_module.make_ig_callback(args, torch.zeros(4, 4))
    assert callback.target.label == target  # checked into the one Target
    assert callback.action_names == (None if target == "mean" else ["left", "right"])  # V(s) has no actions
    assert example_module.parse_args([]).ig_target == "mean"  # V(s), as before
    with pytest.raises(SystemExit):
        example_module.parse_args(["--ig-target", "left"])


def test_accelerator_gpu_without_a_gpu_exits_2_before_a_run_starts(
    example_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_gpu_refused_without_a_gpu(example_module, "dqn_cartpole.py", tmp_path / "runs", monkeypatch, capsys)


def test_an_mlflow_run_starts_without_lightnings_experiment_not_found_warning(
    example_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_mlflow_logger_starts_quietly(example_module, tmp_path / "runs", monkeypatch)


def test_an_mlflow_tracking_uri_that_is_a_plain_path_is_a_file_store(
    example_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # guards against: --mlflow-tracking-uri ./mlruns ended in MLflow's raw MlflowException ("The filesystem tracking
    # backend ... is in maintenance mode"): only a file: URI got the file-store switch
    assert_mlflow_takes_a_plain_path(example_module, tmp_path, monkeypatch)


def test_an_mlflow_server_that_does_not_answer_is_said(
    example_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: --mlflow-tracking-uri http://... with no server waited about 4 minutes in MLflow's retries
    # without a word, then ended in MLflow's raw MlflowException traceback
    assert_mlflow_unreachable_says_so(example_module, tmp_path, monkeypatch, capsys)


def test_an_mlflow_server_that_refuses_is_not_said_unreachable(
    example_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: a server that answered 401 (a login it needs) said "MLflow cannot reach it ...; start the server"
    assert_mlflow_refusing_is_not_unreachable(example_module, tmp_path, monkeypatch, capsys)


def test_wandb_without_a_login_says_what_to_do(tmp_path: Path) -> None:
    # guards against: --logger wandb without `wandb login` nor WANDB_MODE=offline ended in wandb's UsageError traceback
    assert_wandb_without_login_says_what_to_do(EXAMPLE, tmp_path)
