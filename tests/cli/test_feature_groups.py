"""`lightning-ig diag` on pixel agents: --feature-groups, --saliency, and `show`.

The end-to-end runs go through subprocesses, as a user runs them (started together: each costs seconds of
imports); the checks of every bad --feature-groups form run in-process.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
from PIL import Image

from lightning_ig import cli, models
from lightning_ig.attribution import integrated_gradients
from lightning_ig.checkpoint import load_checkpoint, save_checkpoint
from lightning_ig.models import DuelingQNetwork
from lightning_ig.models.noise import noise_disabled
from lightning_ig.views.pictures.saliency import mean_abs_map, saliency_grid
from lightning_ig.views.report import load_schema
from tests.support import repo_env
from tests.support.tolerance import assert_close_scaled

FRAME = (4, 10, 10)  # MinAtar Breakout's observation, channels first


def _minatar_network() -> torch.nn.Module:
    """The registered MinAtar network (models.MinAtarQNetwork), or a stand-in of the same shape where it is missing."""
    torch.manual_seed(0)
    network = getattr(models, "MinAtarQNetwork", None)
    if network is not None:
        return network(in_channels=FRAME[0], num_actions=3)
    from tests.support.cli_models import MinAtarShaped

    return MinAtarShaped(FRAME[0], 3)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    if args[:1] == ["diag"] and "--completeness-tol" not in args:
        # Groups and pictures are the subject here, not accuracy: a random-init conv net's 64-step error (~5%) would
        # exit 4 (the verdict's status, tested in tests/cli/test_diag_verdict.py).
        args = [*args, "--completeness-tol", "0.5"]
    return subprocess.run(
        [sys.executable, "-m", "lightning_ig.cli", *args],
        cwd=cwd,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli_images")
    (root / "out").mkdir()
    generator = torch.Generator().manual_seed(0)
    frames = (torch.rand(20, *FRAME, generator=generator) < 0.2).float()  # MinAtar frames are 0/1 per channel
    save_checkpoint(_minatar_network(), root / "minatar.safetensors", states=frames)
    save_checkpoint(
        DuelingQNetwork(4, 2, hidden_sizes=(8,)),
        root / "flat.safetensors",
        states=torch.randn(20, 4, generator=generator),
    )
    return root


@pytest.fixture(scope="module")
def runs(workspace: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    jobs = {
        "pixels": [
            "diag",
            "--checkpoint",
            "minatar.safetensors",
            "--states",
            "auto",
            "--auto-samples",
            "6",
            "--num-steps",
            "16",
            "--feature-groups",
            "channels",
            "--saliency",
            "saliency",
            "--output",
            "out/minatar.json",
        ],
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda args: _run(args, workspace), jobs.values()))
    return dict(zip(jobs, done))


def _validate(report: dict) -> None:
    jsonschema.validate(report, load_schema(), cls=jsonschema.Draft202012Validator)


def _direct(workspace: Path, name: str, indices: list[int], n_steps: int, **options):
    loaded = load_checkpoint(workspace / name)
    model = loaded.model.eval()
    with noise_disabled(model):
        return (
            model,
            loaded.states[indices],
            integrated_gradients(model, loaded.states[indices], n_steps=n_steps, **options),
        )


def test_pixel_checkpoint_with_channel_groups_end_to_end(workspace, runs):
    run = runs["pixels"]
    assert run.returncode == 0, run.stderr
    report = json.loads((workspace / "out" / "minatar.json").read_text())
    _validate(report)
    assert report["feature_shape"] == list(FRAME) and report["state_dim"] == 400 and report["num_states"] == 6
    assert [(g["name"], g["members"]) for g in report["groups"]] == [(f"channel {c}", 100) for c in range(4)]
    # a group's mean attribution is the sum of its members' means (the attribution of a group is their sum)
    per_feature = np.array([f["mean_signed"] for f in report["features"]]).reshape(4, 100)
    scale = max(f["mean_abs"] for f in report["features"]) * 100
    assert_close_scaled([g["mean_signed"] for g in report["groups"]], per_feature.sum(1), ulps=256, scale=scale)
    _, _, result = _direct(workspace, "minatar.safetensors", report["state_indices"], 16, target="mean")
    channels = result.grouped("channels").double()  # (6, 4)
    assert_close_scaled([g["mean_abs"] for g in report["groups"]], channels.abs().mean(0), ulps=256, scale=scale)


def test_saliency_pngs_are_the_reports_states(workspace, runs):
    assert runs["pixels"].returncode == 0, runs["pixels"].stderr
    report = json.loads((workspace / "out" / "minatar.json").read_text())
    assert sorted(path.name for path in (workspace / "saliency").iterdir()) == ["saliency.png", "saliency_mean_abs.png"]
    assert "wrote saliency/saliency.png, saliency/saliency_mean_abs.png" in runs["pixels"].stdout
    _, states, result = _direct(workspace, "minatar.safetensors", report["state_indices"], 16, target="mean")
    attributions = result.attributions.double().numpy()
    expected = {
        "saliency.png": saliency_grid(states.double().numpy(), attributions).pixels,
        "saliency_mean_abs.png": mean_abs_map(np.abs(attributions).mean(0), 6).pixels,
    }
    for name, pixels in expected.items():
        data = (workspace / "saliency" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert decoded.shape == pixels.shape and decoded.dtype == np.uint8
        # the same picture up to a colour step where two processes' float32 sums round apart
        assert np.mean(np.abs(decoded.astype(int) - pixels.astype(int)) > 3) < 0.01, name
    assert (
        expected["saliency.png"].shape[1] == 320
    )  # the card-sized grid (lightning_ig.views.pictures.raster.CARD_WIDTH)


def test_show_prints_the_groups_table(workspace, runs, capsys):
    assert runs["pixels"].returncode == 0, runs["pixels"].stderr
    assert cli.main(["show", str(workspace / "out" / "minatar.json"), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "groups by share of |attribution| (as the verdict card) (4 groups" in out
    table = out[out.index("groups by share") :].splitlines()[2:5]
    assert len(table) == 3 and all("channel" in line and " 100 " in line for line in table)
    shares = [float(line.split()[3].rstrip("%")) for line in table]  # the largest first
    assert shares == sorted(shares, reverse=True) and 25 <= shares[0] <= 100


def _groups_file(workspace: Path, name: str, text: str) -> str:
    path = workspace / "groups" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return str(path)


BAD_GROUPS = [
    ("missing.json", None, "neither 'channels', 'features' nor an existing JSON file"),
    ("broken.json", '{"a": [0, 1', "is not readable JSON"),
    ("text.json", '"pixels"', "holds a JSON str"),
    ("number_entry.json", '{"a": 3}', "group 'a' is a JSON int, not a list"),
    ("mixed.json", '{"a": [true, 1]}', "must hold only whole numbers (indices) or only true/false, found 1"),
    ("nested_indices.json", '{"a": [[0, 1], [2, 3]]}', "list flat feature indices, or give a true/false mask"),
    ("float_mask.json", json.dumps(np.zeros(FRAME).tolist()), "must hold only whole numbers (group ids), found 0.0"),
    (
        "bool_mask.json",
        json.dumps(np.zeros(FRAME, dtype=bool).tolist()),
        "must hold only whole numbers (group ids), found False",
    ),
    ("ragged.json", "[[0, 1], [2]]", "ragged nested list"),
    (
        "wrong_shape.json",
        json.dumps(np.zeros((3, 10, 10), dtype=int).tolist()),
        "does not fit the feature shape (4, 10, 10)",
    ),
    ("negative.json", json.dumps(np.full(FRAME, -1).tolist()), "ids must be >= 0, got -1"),
    ("empty_group.json", '{"a": [0], "b": []}', "group 'b' is empty"),
    ("repeated.json", '{"a": [0], "a": [1]}', "names the key 'a' twice"),
    ("overlap.json", '{"a": [0, 1], "b": [1]}', "feature 1 is in group 'b' and in group 'a'"),
    ("out_of_range.json", '{"a": [400]}', "holds index 400, outside the 400 features"),
    (
        "mask_shape.json",
        json.dumps({"a": np.ones((4, 3), dtype=bool).tolist()}),
        "does not fit the feature shape (4, 10, 10)",
    ),
    ("empty.json", "{}", "the file names no group"),
]


@pytest.mark.parametrize(("name", "text", "words"), BAD_GROUPS, ids=[case[0] for case in BAD_GROUPS])
def test_every_bad_feature_groups_file_is_one_line_and_status_2(workspace, capsys, name, text, words):
    path = str(workspace / "groups" / name) if text is None else _groups_file(workspace, name, text)
    output = workspace / "out" / f"bad_{name}"
    code = cli.main(
        [
            "diag",
            "--checkpoint",
            str(workspace / "minatar.safetensors"),
            "--auto-samples",
            "2",
            "--feature-groups",
            path,
            "--output",
            str(output),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert words in err and "--feature-groups" in err, err
    assert "feature_groups" not in err and "dict" not in err, err  # the engine's Python words, said as the flag's
    assert not output.exists()


def test_good_group_files_of_every_form(workspace, capsys):
    forms = {
        "indices.json": json.dumps({"left": list(range(200)), "right": list(range(200, 400))}),
        "masks.json": json.dumps(
            {"top": [[[r < 5] * 10 for r in range(10)]], "bottom": [[[r >= 5] * 10 for r in range(10)]]}
        ),
        "ids.json": json.dumps(np.arange(4).repeat(100).reshape(FRAME).tolist()),
    }
    expected = {
        "indices.json": [("left", 200), ("right", 200)],
        "masks.json": [("top", 200), ("bottom", 200)],
        "ids.json": [(f"group {g}", 100) for g in range(4)],
    }
    for name, text in forms.items():
        output = workspace / "out" / f"good_{name}"
        code = cli.main(
            [
                "diag",
                "--checkpoint",
                str(workspace / "minatar.safetensors"),
                "--auto-samples",
                "2",
                "--num-steps",
                "4",
                "--completeness-tol",
                "0.5",  # 4 steps: the groups are the subject, not the accuracy
                "--feature-groups",
                _groups_file(workspace, name, text),
                "--output",
                str(output),
                "--quiet",
            ]
        )
        assert code == 0, capsys.readouterr().err
        report = json.loads(output.read_text())
        _validate(report)
        assert [(g["name"], g["members"]) for g in report["groups"]] == expected[name]
    output = workspace / "out" / "good_features.json"
    code = cli.main(
        [
            "diag",
            "--checkpoint",
            str(workspace / "flat.safetensors"),
            "--auto-samples",
            "3",
            "--num-steps",
            "4",
            "--completeness-tol",
            "0.5",  # 4 steps: the groups are the subject, not the accuracy
            "--feature-groups",
            "features",
            "--output",
            str(output),
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads(output.read_text())
    assert [(g["name"], g["members"]) for g in report["groups"]] == [(f"x{i}", 1) for i in range(4)]
    assert [g["mean_abs"] for g in report["groups"]] == [f["mean_abs"] for f in report["features"]]


def test_channels_on_vector_states_says_the_feature_shape_once(workspace, capsys):
    output = workspace / "out" / "flat_channels.json"
    args = ["diag", "--checkpoint", str(workspace / "flat.safetensors"), "--output", str(output), "--quiet"]
    code = cli.main([*args, "--feature-groups", "channels"])
    err = capsys.readouterr().err
    assert code == 2 and "--feature-groups channels" in err and err.count("(4,)") == 1, err
    (workspace / "empty_group.json").write_text('{"a": [0], "b": []}')  # an error that does not say it gets it
    code = cli.main([*args, "--feature-groups", str(workspace / "empty_group.json")])
    err = capsys.readouterr().err
    assert code == 2 and "is empty" in err and "the states have feature shape (4,)" in err, err
    assert not output.exists()


def test_saliency_needs_spatial_states_and_a_folder_checked_first(workspace, capsys):
    output = workspace / "out" / "flat.json"
    code = cli.main(
        [
            "diag",
            "--checkpoint",
            str(workspace / "flat.safetensors"),
            "--saliency",
            str(workspace / "flat_saliency"),
            "--output",
            str(output),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--saliency draws states with spatial dimensions" in err and "(4,)" in err
    assert not output.exists()
    (workspace / "a_file").write_text("")
    code = cli.main(
        [
            "diag",
            "--checkpoint",
            str(workspace / "flat.safetensors"),  # states --saliency cannot draw: said only once it is loaded
            "--saliency",
            str(workspace / "a_file"),
            "--output",
            str(output),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--saliency" in err and "is a file, not a folder" in err  # before the checkpoint is opened
    code = cli.main(
        [
            "diag",
            "--checkpoint",
            str(workspace / "flat.safetensors"),
            "--feature-groups",
            "channels",
            "--output",
            str(output),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--feature-groups channels" in err and "needs states with a channel dimension" in err
    # what the flag takes, not Python's "feature_groups='channels' ... use 'features', a mask or a dict"
    assert err.endswith(": use 'features' or a JSON file of groups\n") and "feature_groups" not in err, err


def test_channels_take_their_names_from_the_stored_names_where_these_name_them():
    # guards against: "channel 0" ... for a checkpoint whose names say paddle[0,0] ... (the MinAtar example's)
    from lightning_ig.cli.feature_groups import resolve_feature_groups

    names = [f"{channel}[{row},{column}]" for channel in ("paddle", "ball") for row in range(2) for column in range(3)]
    assert resolve_feature_groups("channels", (2, 2, 3), names).names == ["paddle", "ball"]
    for other in (
        [f"x[{i}]" for i in range(12)],  # one name for both channels
        names[:6] + [f"ball{i}" for i in range(6)],  # a channel whose names differ
        [f"[{i}]" for i in range(12)],  # no name before the bracket
    ):
        assert resolve_feature_groups("channels", (2, 2, 3), other).names == ["channel 0", "channel 1"]
