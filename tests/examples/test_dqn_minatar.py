"""End to end: examples/dqn_minatar.py with tiny settings on the CPU, through a subprocess as a user runs it.

One short training run (the IG callback on) is shared by the tests: it must
exit 0, leave the ``ig/`` tags in its TensorBoard folder, and a checkpoint that
:func:`lightning_ig.load_checkpoint` rebuilds as a MinAtar network with its
held-out frames, which ``lightning-ig diag --states auto`` turns into a valid
report. A second run with the same seed and the callback off must give
bit-identical weights.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from tests.support.tolerance import rounding_bound

pytest.importorskip("minatar", reason="the MinAtar example needs minatar (pip install 'lightning-ig[examples]')")

from lightning_ig import load_checkpoint
from lightning_ig.models import MinAtarQNetwork
from lightning_ig.views.report import load_schema
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

EXAMPLE = REPO / "examples" / "dqn_minatar.py"
CHANNEL_NAMES = ["paddle", "ball", "trail", "brick"]  # MinAtar Breakout's channels, in order
NUM_HELD_OUT = 8
TINY = [
    "--total-timesteps",
    "1200",
    "--learning-starts",
    "400",
    "--num-envs",
    "4",
    "--batch-size",
    "32",
    *("--ig-overhead", "none"),  # a tiny fit: every run at its step, whatever the machine's speed
    "--ig-every-n-steps",
    "100",
    "--ig-n-steps",
    "8",
    "--num-held-out",
    str(NUM_HELD_OUT),
    "--eval-episodes",
    "2",
    "--random-episodes",
    "4",
    "--no-progress-bar",
    "--accelerator",
    "cpu",
    "--seed",
    "3",
    "--fused-loss",  # the package's loss as the auxiliary loss: its torch twin on the CPU
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    workdir = tmp_path_factory.mktemp("minatar")
    proc = _run([str(EXAMPLE), *TINY, "--runs-dir", "runs"], cwd=workdir)
    return proc, workdir / "runs"


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def test_exits_zero_and_prints_return_against_random_and_channels(tiny_run) -> None:
    proc, runs = tiny_run
    _ok(proc)
    out = proc.stdout
    assert "gradient steps/s" in out and "env steps/s" in out
    assert "random policy" in out and "over 4 episodes" in out
    assert "auxiliary loss lightning-ig fused soft-margin" in out
    assert "trained on cpu" in out  # the device of the fit, not where Lightning leaves the module afterwards
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("attribution of V(s) per channel"))
    printed = [line.split()[0] for line in lines[start + 1 : start + 5]]
    assert sorted(printed) == sorted(CHANNEL_NAMES)
    for line in lines[start + 1 : start + 5]:  # both signs, cell by cell, and the net they leave
        words = line.split()
        up, down, net = float(words[3]), float(words[6]), float(words[8])
        assert up >= 0 and down >= 0 and abs(up - down - net) <= 1.5e-4 + 1e-12, line  # three 4-decimal roundings
    assert _only_run_dir(runs).name.startswith("MinAtar-breakout__dqn_minatar__3__")


def test_tensorboard_folder_holds_the_ig_tags(tiny_run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc, runs = tiny_run
    _ok(proc)
    accumulator = EventAccumulator(str(_only_run_dir(runs)), size_guidance={"scalars": 0, "images": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = set(tags["scalars"])
    expected = {
        "ig/completeness/worst_attribution_error",
        "ig/time_ms",
        "charts/episodic_return",
        "losses/td_loss",
        "eval/mean_return",
        "eval/random_mean_return",
    }
    for channel in CHANNEL_NAMES:  # one curve per object, not one per pixel
        expected |= {f"ig/group/mean_abs/{channel}", f"ig/group/mean_signed/{channel}"}
    assert expected <= scalars, f"missing scalar tags: {sorted(expected - scalars)}"
    assert not any(tag.startswith("ig/mean_abs/") for tag in scalars), "400 pixels must not get a curve each"
    # (1200 - 400) / 4 = 200 gradient steps, a run every 100
    assert [e.step for e in accumulator.Scalars("ig/completeness/worst_attribution_error")] == [100, 200]
    saliency = accumulator.Images("ig/2_saliency")
    assert [image.step for image in saliency] == [100, 200]
    assert saliency[-1].width > 0 and saliency[-1].height > 0 and saliency[-1].encoded_image_string[:4] == b"\x89PNG"
    assert "ig/completeness/worst_relative_error" not in scalars  # the old ratio: in the JSON report only


def test_checkpoint_rebuilds_the_minatar_network_with_its_frames(tiny_run) -> None:
    proc, runs = tiny_run
    _ok(proc)
    loaded = load_checkpoint(_only_run_dir(runs) / "q_network.safetensors")
    assert isinstance(loaded.model, MinAtarQNetwork)
    assert loaded.model.config()["in_channels"] == 4 and loaded.model.config()["num_actions"] == 3
    assert loaded.model.config()["activation"] == "relu"  # the default: MinAtar's and the Nature network's own
    assert loaded.states is not None and tuple(loaded.states.shape) == (NUM_HELD_OUT, 4, 10, 10)
    assert set(torch.unique(loaded.states).tolist()) <= {0.0, 1.0}  # MinAtar frames are 0/1
    assert json.loads(loaded.metadata["channel_names"]) == CHANNEL_NAMES
    names = loaded.feature_names  # each pixel by its channel and cell, as the report names it (not x[3,3,9])
    assert names is not None and (names[0], names[99], names[100], names[399]) == (
        "paddle[0,0]",
        "paddle[9,9]",
        "ball[0,0]",
        "brick[9,9]",
    )
    assert float(loaded.metadata["random_mean_return"]) >= 0
    q_values = loaded.model.eval()(loaded.states)
    assert q_values.shape == (NUM_HELD_OUT, 3) and torch.isfinite(q_values).all()


def test_diag_reports_the_channels_by_name_with_saliency_images(tiny_run, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    proc, runs = tiny_run
    _ok(proc)
    run_dir = _only_run_dir(runs)
    groups_file = run_dir / "channel_groups.json"
    assert f"--feature-groups {Path('runs', run_dir.name, groups_file.name)}" in proc.stdout  # it prints the command
    output = tmp_path / "report.json"
    diag = _run(
        [
            "-m",
            "lightning_ig.cli",
            "diag",
            "--checkpoint",
            str(run_dir / "q_network.safetensors"),
            "--states",
            "auto",
            "--auto-samples",
            "4",
            "--feature-groups",
            str(groups_file),
            "--saliency",
            str(tmp_path / "saliency"),
            "--output",
            str(output),
        ],
        cwd=tmp_path,
        timeout=120,
    )
    _ok(diag)
    report = json.loads(output.read_text())
    jsonschema.validate(report, load_schema())
    assert report["num_states"] == 4 and report["state_dim"] == 4 * 10 * 10
    assert [(group["name"], group["members"]) for group in report["groups"]] == [(name, 100) for name in CHANNEL_NAMES]
    # a group's attribution is the sum of its pixels': the groups' signed means add up to the features'
    # (float32 attributions summed in two orders: a few float32 roundings per member, at the size of sum |attr|)
    total = sum(feature["mean_signed"] for feature in report["features"])
    size = sum(feature["mean_abs"] for feature in report["features"])
    bound = rounding_bound(size, ulps=2 * 100, dtype=torch.float32)  # 100 pixels a group
    assert abs(sum(group["mean_signed"] for group in report["groups"]) - total) <= bound
    for png in ("saliency.png", "saliency_mean_abs.png"):
        assert (tmp_path / "saliency" / png).read_bytes()[:4] == b"\x89PNG"


def test_the_printed_diag_command_runs_as_printed(tiny_run) -> None:
    # guards against: with fewer held-out frames (8) than diag samples by default (16), the printed command failed
    # ("--auto-samples 16 is more than the 8 states stored")
    proc, runs = tiny_run
    _ok(proc)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("diagnose it with"))
    command = line.removeprefix("diagnose it with").strip()
    assert f"--auto-samples {NUM_HELD_OUT}" in command
    done = subprocess.run(
        ["bash", "-c", command],  # as a user pastes it
        cwd=runs.parent,
        env=example_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # diag's exit status says what the closing verdict says: 0 within the tolerance, 4 not (the report is written)
    verdict = next(line for line in proc.stdout.splitlines() if line.startswith("IG verdict"))
    assert done.returncode == (0 if "✓ attributions add up" in verdict else 4), (verdict, done.stderr[-2000:])
    output = shlex.split(command)[-1]
    report = json.loads((runs.parent / output).read_text())
    # the run's --ig-n-steps 8, not diag's default 'auto': its figures are the closing lines'
    assert (report["num_states"], report["num_steps"]) == (NUM_HELD_OUT, 8)


def test_same_seed_same_weights_with_or_without_the_callback(tiny_run, tmp_path: Path) -> None:
    proc, runs = tiny_run
    _ok(proc)
    again = _run([str(EXAMPLE), *TINY, "--no-ig", "--runs-dir", "runs"], cwd=tmp_path)
    _ok(again)
    first = load_checkpoint(_only_run_dir(runs) / "q_network.safetensors")
    second = load_checkpoint(_only_run_dir(tmp_path / "runs") / "q_network.safetensors")
    first_state, second_state = first.model.state_dict(), second.model.state_dict()
    assert first_state.keys() == second_state.keys()
    for name, tensor in first_state.items():
        assert torch.equal(tensor, second_state[name]), f"{name} differs between two runs with seed 3"
    assert torch.equal(first.states, second.states)


def test_help_lists_the_flags(tmp_path: Path) -> None:
    proc = _run([str(EXAMPLE), "--help"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "--num-envs NUM_ENVS games stepped as one batch" in text
    assert "--fused-loss, --no-fused-loss" in text
    assert "{breakout,asterix,freeway,seaquest,space_invaders}" in text
    assert "on the GPU" not in text  # guards against: said of a run that trains on the CPU where there is no GPU
    assert "(default: None)" not in text
    # each default said once, by the formatter: --ig-overhead's help also wrote "(default 0.02)" before it
    assert "(default 0.02)" not in text and "(default: 0.02)" in text


def test_help_answers_before_torch_lightning_and_minatar_are_imported(tmp_path: Path) -> None:
    proc = _run(["-X", "importtime", str(EXAMPLE), "--help"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "--num-envs" in proc.stdout, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")}
    assert not imported & {"torch", "lightning", "minatar", "lightning_ig"}, sorted(imported)[:20]


def test_bad_flag_exits_2_with_a_message(tmp_path: Path) -> None:
    proc = _run([str(EXAMPLE), "--no-such-flag"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "error: unrecognized arguments: --no-such-flag" in proc.stderr
    assert not (tmp_path / "runs").exists(), "a rejected command line must not start a run"


@pytest.fixture(scope="module")
def example_module() -> ModuleType:
    return load_example(EXAMPLE, "dqn_minatar_example")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-envs", "0"], "argument --num-envs: must be >= 1, got 0"),
        (["--game", "pong"], "argument --game: invalid choice: 'pong'"),
        (["--buffer-size", "10", "--num-envs", "8"], "--buffer-size 10 is too small for --num-envs 8"),
        (["--ig-n-steps", "many"], "--ig-n-steps: must be a whole number >= 1, 'budget' or 'auto', got 'many'"),
        # too few random steps to store a step with --n-step later ones: it crashed at the first sample
        (["--learning-starts", "0"], "--learning-starts must be at least 49 with --num-envs 16 and --n-step 3"),
        (["--learning-starts", "12", "--num-envs", "4"], "--learning-starts must be at least 13 with --num-envs 4"),
        # numpy's range for the games seeded --seed + 2000 + i
        (["--seed", "4294967295"], "--seed must be in [0, 4294965288] with these settings"),
        (["--learning-rate", "nan"], "argument --learning-rate: must be a finite number, got nan"),
        (["--gamma", "inf"], "argument --gamma: must be a finite number, got inf"),
        *SHARED_BAD_FLAGS,
    ],
)
def test_bad_value_exits_2_with_a_message(example_module, flags, message, capsys) -> None:
    assert_refused_at_parse(example_module, flags, message, capsys)


@pytest.mark.parametrize("name", ["it's mine", ""])
def test_an_experiment_name_mlflow_refuses_exits_2(
    example_module: ModuleType, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: MLflow's experiment search failed on a quote (and refuses an empty name) after the run folder
    # was made
    assert_mlflow_refuses_exp_name(example_module, name, capsys)


def test_the_edges_of_the_ranges_are_taken(example_module) -> None:
    # the smallest warm-up that fills the replay, the largest seed the games take with the defaults
    assert example_module.parse_args(["--learning-starts", "13", "--num-envs", "4"]).learning_starts == 13
    assert example_module.parse_args(["--seed", "4294965288"]).seed == 2**32 - 1 - 2_007


def test_the_printed_commands_are_shell_quoted(example_module, tmp_path: Path) -> None:
    # guards against: a --runs-dir with a space or an --exp-name with a quote broke the printed commands; a run with
    # fewer held-out frames than diag samples by default (16) printed a diag command that diag refused
    from lightning.pytorch.loggers import TensorBoardLogger

    from lightning_ig.cli.parser import build_parser

    run_dir = tmp_path / "my runs" / "MinAtar-breakout__it's mine__1__1796119555"
    paths = [run_dir / name for name in ("q_network.safetensors", "channel_groups.json", "saliency", "ig_report.json")]
    words = shlex.split(example_module.diag_command(paths[0], 8, *paths[1:]))
    assert words[words.index("--auto-samples") + 1] == "8"
    parsed = build_parser().parse_args(words[words.index("diag") :])  # as lightning-ig reads it
    assert [parsed.checkpoint, parsed.feature_groups, parsed.saliency, parsed.output] == [str(p) for p in paths]
    assert parsed.auto_samples == 8
    assert "--auto-samples" not in shlex.split(example_module.diag_command(paths[0], 16, *paths[1:]))
    assert "--auto-samples 64 " in example_module.diag_command(paths[0], 64, *paths[1:])  # all: the run's figures
    each = shlex.split(example_module.diag_command(paths[0], 64, *paths[1:], "each"))
    parsed_each = build_parser().parse_args(each[each.index("diag") :])
    assert parsed_each.target == "each" and parsed.target == "mean"  # the run's --ig-target: its report is about that
    # a run on a GPU (the example's default where there is one): diag there too, its "budget" the GPU's points
    on_gpu = shlex.split(example_module.diag_command(paths[0], 64, *paths[1:], "mean", "budget", "cuda:0"))
    parsed_gpu = build_parser().parse_args(on_gpu[on_gpu.index("diag") :])
    assert (parsed_gpu.device, parsed_gpu.num_steps, parsed.device) == ("cuda:0", "budget", "cpu")
    assert "--device" not in example_module.diag_command(paths[0], 64, *paths[1:], "mean", "auto", "cpu")

    runs = tmp_path / "my runs"
    args = example_module.parse_args(["--runs-dir", str(runs)])
    logger = TensorBoardLogger(save_dir=runs, name="run", version="", default_hp_metric=False)
    words = shlex.split(example_module.close_logger(logger, args, run_dir))
    assert Path(words[0]).name == "tensorboard" and words[1:] == ["--logdir", str(runs)]


def test_the_summary_says_what_has_no_number(example_module) -> None:
    # guards against: "1000000000.0x" the random policy's return where it scored 0; "nan" for a diverged run's channels
    assert example_module.ratio_to_random(1.0, 0.0) == "ratio undefined (the random policy's mean return is 0.00)"
    assert example_module.ratio_to_random(0.5, 0.25) == "2.0x"
    mass = torch.tensor([0.5, float("nan"), 2.0, float("inf"), 0.5], dtype=torch.float64)
    assert example_module.channel_order(mass) == [2, 0, 4, 1, 3]  # largest first, ties in order, non-finite last
    assert example_module.number(float("nan"), "+.4f") == "n/a (NaN/Inf)"
    assert example_module.number(0.25, ".4f") == "0.2500"


def test_a_diverged_run_saves_its_checkpoint_and_says_so(tmp_path: Path) -> None:
    # guards against: "nan" in the channel lines of a run that diverged, the checkpoint saved after the attributions
    flags = ["--total-timesteps", "800", "--learning-starts", "100", "--num-envs", "4", "--learning-rate", "1e30"]
    quick = ["--no-anneal-lr", "--eval-episodes", "1", "--random-episodes", "2", "--num-held-out", "8"]
    quick += ["--ig-n-steps", "8", "--accelerator", "cpu", "--no-progress-bar", "--seed", "3"]
    proc = _run([str(EXAMPLE), *flags, *quick, "--runs-dir", "runs"], cwd=tmp_path)
    _ok(proc)
    assert "raises V(s) n/a (NaN/Inf)   lowers it n/a (NaN/Inf)   net n/a (NaN/Inf)" in proc.stdout
    assert (_only_run_dir(tmp_path / "runs") / "q_network.safetensors").is_file()


@pytest.fixture
def quiet_main(example_module, monkeypatch):
    """The example with ``main``'s process-wide settings (torch's threads, the global seeds, log filters) left alone."""
    monkeypatch.setattr(example_module.torch, "set_num_threads", lambda threads: None)
    monkeypatch.setattr(example_module.L, "seed_everything", lambda *args, **kwargs: None)
    monkeypatch.setattr(example_module, "quiet_third_parties", lambda: None)
    return example_module


@pytest.mark.parametrize(("error", "status", "how"), STOPS)
def test_a_run_that_fails_after_its_folder_is_made_says_so(
    quiet_main, tmp_path, monkeypatch, capsys, error, status, how
) -> None:
    # guards against: a traceback and a half-written run folder that looked like a run's; Lightning's SIGTERM (a
    # SystemExit without a code) exiting 0, silently
    def fail(*args: object) -> None:
        raise error

    monkeypatch.setattr(quiet_main, "make_logger", fail)
    with pytest.raises(type(error) if isinstance(error, RuntimeError) else SystemExit) as raised:
        quiet_main.main(["--runs-dir", str(tmp_path / "runs"), "--accelerator", "cpu"])
    assert status is None or raised.value.code == status
    run_dir = _only_run_dir(tmp_path / "runs")
    assert (
        f"dqn_minatar.py: the run {how}: {run_dir} holds only what it wrote before the error, no checkpoint"
    ) in capsys.readouterr().err


def test_a_run_stopped_in_its_evaluation_keeps_its_checkpoint(quiet_main, tmp_path, monkeypatch, capsys) -> None:
    # guards against: Ctrl-C during the closing evaluation losing the trained network (it was saved after it)
    metadata = stopped_in_evaluation(quiet_main, TINY, tmp_path / "runs", monkeypatch, capsys)
    assert metadata["game"] == "breakout" and json.loads(metadata["channel_names"]) == CHANNEL_NAMES


def test_ig_n_steps_takes_what_the_library_takes(example_module) -> None:
    for given, parsed in (("auto", "auto"), ("budget", "budget"), ("12", 12)):
        assert example_module.parse_args(["--ig-n-steps", given]).ig_n_steps == parsed


def test_replay_n_step_returns_stop_at_the_end_of_a_game(example_module) -> None:
    args = example_module.parse_args(
        ["--num-envs", "1", "--buffer-size", "64", "--n-step", "3", "--gamma", "0.5", "--batch-size", "256"]
    )
    buffer = example_module.ReplayBuffer(args, (1, 10, 10), torch.device("cpu"))
    rewards, terminals = [1.0, 2.0, 4.0, 8.0, 16.0], [0.0, 1.0, 0.0, 0.0, 0.0]  # the first game ends at step 1
    for step, (reward, terminal) in enumerate(zip(rewards, terminals)):
        frame = torch.full((1, 1, 10, 10), step, dtype=torch.uint8)
        buffer.add(frame, torch.tensor([step]), torch.tensor([reward]), torch.tensor([terminal]))
    observations, actions, returns, next_observations, discounts, reward_soon = buffer.sample()
    starts = actions.tolist()
    assert set(starts) == {0, 1}  # only starts with 3 later steps stored
    expected = {0: (1 + 0.5 * 2, 0.0), 1: (2.0, 0.0)}  # both windows hold the game's end: no bootstrap
    for row, start in enumerate(starts):
        assert observations[row, 0, 0, 0].item() == start
        assert next_observations[row, 0, 0, 0].item() == start + 3
        assert (returns[row].item(), discounts[row].item()) == expected[start]
        assert reward_soon[row].item() == 1.0
    # a window without an end bootstraps with gamma^n
    for step, reward in enumerate([0.0, 0.0, 0.0, 0.0], start=5):
        buffer.add(
            torch.full((1, 1, 10, 10), step, dtype=torch.uint8),
            torch.tensor([step]),
            torch.tensor([reward]),
            torch.tensor([0.0]),
        )
    _, actions, returns, _, discounts, reward_soon = buffer.sample()
    by_start = {int(a): (float(r), float(d), float(s)) for a, r, d, s in zip(actions, returns, discounts, reward_soon)}
    assert by_start[2] == (4 + 0.5 * 8 + 0.25 * 16, 0.125, 1.0)
    assert by_start[4] == (16.0, 0.125, 1.0)
    assert by_start[5] == (0.0, 0.125, -1.0)


def test_vector_env_gives_channels_first_frames_and_restarts_finished_games(example_module) -> None:
    envs = example_module.MinAtarVectorEnv("breakout", 3, seed=0)
    assert envs.channel_names == CHANNEL_NAMES and len(envs.action_set) == 3
    observations = envs.reset()
    assert observations.shape == (3, 4, 10, 10) and observations.dtype == np.uint8
    assert (observations[:, CHANNEL_NAMES.index("paddle"), 9].sum(axis=1) == 1).all()  # the paddle is on the last row
    ended = 0
    for _ in range(200):
        observations, (_, terminals) = envs.step(np.zeros(3, dtype=np.int64))  # no-op: the ball falls
        ended += int(terminals.sum())
        assert (observations[:, CHANNEL_NAMES.index("ball")].reshape(3, -1).sum(axis=1) == 1).all()
    assert ended > 3  # games ended and restarted with a ball


def test_the_default_activation_is_relu_and_the_help_says_why(example_module) -> None:
    assert example_module.parse_args([]).activation == "relu"
    assert example_module.parse_args(["--activation", "silu"]).activation == "silu"


@pytest.mark.parametrize("target", ["mean", "each", "contrast"])
def test_ig_target_reaches_the_callback_with_the_games_action_names(example_module, target) -> None:
    args = example_module.parse_args(["--ig-target", target])
    envs = example_module.MinAtarVectorEnv("breakout", 1, seed=0)
    assert envs.action_names == ["no-op", "left", "right"]  # Breakout's minimal action set, named
    held_out = torch.zeros(4, 4, 10, 10)
    callback = example_module.make_ig_callback(args, held_out, CHANNEL_NAMES, envs.action_names)
    assert callback.target.label == target  # checked into the one Target
    assert callback.action_names == (None if target == "mean" else envs.action_names)  # V(s) has no actions
    assert example_module.parse_args([]).ig_target == "mean"  # V(s), as before


def test_a_bad_ig_target_exits_2_naming_the_choices(example_module, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        example_module.parse_args(["--ig-target", "left"])
    assert exit_info.value.code == 2
    assert "argument --ig-target: invalid choice: 'left' (choose from" in capsys.readouterr().err


def test_accelerator_gpu_without_a_gpu_exits_2_before_a_run_starts(
    example_module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_gpu_refused_without_a_gpu(example_module, "dqn_minatar.py", tmp_path / "runs", monkeypatch, capsys)


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
