"""`lightning-ig diag`: every file it writes (report, per-head reports, saliency pictures) is one plan, checked first.

The plan is checked before the checkpoint is loaded: an output that is an input (by any name, hard links
included), two outputs that are one file, a picture name that is a folder or a planted link, or an existing
default report: each is exit 2, one line, and nothing on disk changes. Runs go through `cli.main` in-process,
on a tiny convolutional network whose (C, H, W) states can be drawn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_ig import cli
from lightning_ig.checkpoint import save_checkpoint, save_merged_checkpoint
from lightning_ig.models import ConvDuelingQNetwork
from tests.support import REPO

FRAME = (2, 4, 4)
Capsys = pytest.CaptureFixture[str]


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    torch.manual_seed(0)
    net = ConvDuelingQNetwork(FRAME, 2, conv_layers=((2, 3, 1),), hidden_sizes=(4,), activation="tanh")
    states = torch.rand(6, *FRAME, generator=torch.Generator().manual_seed(1))
    save_checkpoint(net, tmp_path / "c.safetensors", states=states)
    save_merged_checkpoint({"up": net, "down": net}, tmp_path / "heads.safetensors", states=states)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _diag(capsys: Capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["diag", "--checkpoint", "c.safetensors", "--auto-samples", "3", "--num-steps", "4", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refused(code: int, err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("lightning-ig diag: error:"), (code, err)
    for word in words:
        assert word in lines[0], (word, lines[0])


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a file's bytes, a link's target, ``"dir"`` for a folder."""
    entries: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            entries[name] = f"-> {os.readlink(path)}"
        else:
            entries[name] = "dir" if path.is_dir() else path.read_bytes()
    return entries


def test_a_link_in_the_saliency_folder_to_the_checkpoint_is_refused(workspace: Path, capsys: Capsys) -> None:
    (workspace / "sal").mkdir()
    (workspace / "sal" / "saliency.png").symlink_to(workspace / "c.safetensors")
    before = _tree(workspace)
    code, _, err = _diag(capsys, "--saliency", "sal", "--output", "r.json")
    _refused(code, err, "--saliency picture 'sal/saliency.png' is a symbolic link", "never writes through a link")
    assert _tree(workspace) == before, "the checkpoint is untouched and no report was written"


def test_a_picture_name_planted_as_a_link_elsewhere_is_refused(workspace: Path, capsys: Capsys) -> None:
    (workspace / "victim.txt").write_text("nobody named me")
    (workspace / "sal").mkdir()
    (workspace / "sal" / "saliency_mean_abs.png").symlink_to(workspace / "victim.txt")
    code, _, err = _diag(capsys, "--saliency", "sal", "--output", "r.json")
    _refused(code, err, "'sal/saliency_mean_abs.png' is a symbolic link")
    assert (workspace / "victim.txt").read_text() == "nobody named me" and not (workspace / "r.json").exists()


def test_an_output_at_a_pictures_name_is_refused_before_any_write(workspace: Path, capsys: Capsys) -> None:
    (workspace / "sal2").mkdir()
    code, out, err = _diag(capsys, "--output", "sal2/saliency.png", "--saliency", "sal2")
    _refused(code, err, "--saliency picture 'sal2/saliency.png' and --output 'sal2/saliency.png' are the same file")
    assert list((workspace / "sal2").iterdir()) == [] and out == ""
    (workspace / "link.json").symlink_to("sal2/saliency_mean_abs.png")  # the same clash through a link
    code, _, err = _diag(capsys, "--output", "link.json", "--saliency", "sal2")
    _refused(code, err, "--output 'link.json'", "are the same file")
    assert list((workspace / "sal2").iterdir()) == []
    code, _, err = _diag(capsys, "--output", "sal3/saliency.png", "--saliency", "sal3")  # a folder still to be made
    _refused(code, err, "are the same file")
    assert not (workspace / "sal3").exists(), "nothing made, not even the folder"


def test_an_output_where_the_saliency_folder_goes_is_refused(workspace: Path, capsys: Capsys) -> None:
    code, _, err = _diag(capsys, "--output", "pictures", "--saliency", "pictures")
    _refused(code, err, "--output 'pictures' and --saliency 'pictures' are the same path")
    assert not (workspace / "pictures").exists()


def test_a_picture_name_that_is_a_folder_is_refused_before_the_report(workspace: Path, capsys: Capsys) -> None:
    (workspace / "sal" / "saliency.png").mkdir(parents=True)
    code, _, err = _diag(capsys, "--saliency", "sal", "--output", "r.json")
    _refused(code, err, "--saliency picture 'sal/saliency.png' is a folder")
    assert not (workspace / "r.json").exists(), "exit 2: no report written"


def test_a_hard_link_of_an_input_is_the_input(workspace: Path, capsys: Capsys) -> None:
    os.link(workspace / "c.safetensors", workspace / "copy.json")
    before = _tree(workspace)
    code, _, err = _diag(capsys, "--output", "copy.json")
    _refused(code, err, "--output 'copy.json' is also an input of this run ('c.safetensors')")
    (workspace / "sal").mkdir()
    os.link(workspace / "c.safetensors", workspace / "sal" / "saliency.png")
    code, _, err = _diag(capsys, "--output", "r.json", "--saliency", "sal")
    _refused(code, err, "--saliency picture 'sal/saliency.png' is also an input")
    assert {name: value for name, value in _tree(workspace).items() if not name.startswith("sal")} == before


def test_two_heads_reports_that_are_one_file_are_refused(workspace: Path, capsys: Capsys) -> None:
    (workspace / "out").mkdir()
    (workspace / "out" / "all.down.json").write_text("an earlier report")
    os.link(workspace / "out" / "all.down.json", workspace / "out" / "all.up.json")  # one file, two names
    code, _, err = _diag(capsys, "--checkpoint", "heads.safetensors", "--all-heads", "--output", "out/all.json")
    _refused(code, err, "'out/all.up.json' and the report of head 'down' 'out/all.down.json' are the same file")
    assert (workspace / "out" / "all.down.json").read_text() == "an earlier report"
    (workspace / "out" / "all.up.json").unlink()
    (workspace / "out" / "all.up.json").symlink_to("all.down.json")  # a name the tool makes up: never followed
    code, _, err = _diag(capsys, "--checkpoint", "heads.safetensors", "--all-heads", "--output", "out/all.json")
    _refused(code, err, "'out/all.up.json' is a symbolic link")
    assert (workspace / "out" / "all.down.json").read_text() == "an earlier report"


def test_wrote_is_said_once_per_file_written(workspace: Path, capsys: Capsys) -> None:
    code, out, err = _diag(capsys, "--saliency", "sal", "--output", "r.json")
    assert code == 0, err
    assert out.count("wrote") == 2 and "wrote r.json:" in out
    assert "wrote sal/saliency.png, sal/saliency_mean_abs.png" in out
    assert json.loads((workspace / "r.json").read_text())["num_states"] == 3
    assert sorted(path.name for path in (workspace / "sal").iterdir()) == ["saliency.png", "saliency_mean_abs.png"]


def test_an_output_of_a_dash_is_refused_rather_than_written_as_a_file_named_dash(
    workspace: Path, capsys: Capsys
) -> None:
    code, out, err = _diag(capsys, "--output", "-")
    _refused(code, err, "--output '-'", "not to stdout", "lightning-ig show")
    assert not (workspace / "-").exists() and out == ""


def test_without_output_an_earlier_report_is_never_replaced(workspace: Path, capsys: Capsys) -> None:
    code, out, err = _diag(capsys)
    assert code == 0 and "wrote ig_report.json" in out, err
    earlier = (workspace / "ig_report.json").read_bytes()
    code, _, err = _diag(capsys, "--seed", "7")
    _refused(code, err, "'ig_report.json' exists", "pass --output 'ig_report.json' to replace it")
    assert (workspace / "ig_report.json").read_bytes() == earlier
    code, _, err = _diag(capsys, "--seed", "7", "--output", "ig_report.json")  # named: the user asked to replace it
    assert code == 0, err
    assert json.loads((workspace / "ig_report.json").read_text())["seed"] == 7


def test_without_output_a_link_at_the_default_name_is_refused(workspace: Path, capsys: Capsys) -> None:
    (workspace / "victim.txt").write_text("kept")
    (workspace / "ig_report.json").symlink_to("victim.txt")
    code, _, err = _diag(capsys)
    _refused(code, err, "'ig_report.json' exists")
    assert (workspace / "victim.txt").read_text() == "kept"


def test_without_output_each_heads_default_report_is_kept(workspace: Path, capsys: Capsys) -> None:
    (workspace / "ig_report.up.json").write_text("an earlier report")
    code, _, err = _diag(capsys, "--checkpoint", "heads.safetensors", "--all-heads")
    _refused(code, err, "'ig_report.up.json' exists", "pass --output 'ig_report.json' to replace it")
    assert (workspace / "ig_report.up.json").read_text() == "an earlier report"
    assert not (workspace / "ig_report.down.json").exists(), "all or none"


def test_the_help_says_what_the_default_output_does(capsys: Capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["diag", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: ig_report.json in the working folder, which is never replaced" in text
    assert "never written through a link" in text and "hard link" in text


# ---------------------------------------------------------------------------------------------
# inputs that are not regular files; outputs all or none on a full disk; the channels by name


_EVERY_INPUT_KIND = """
import os, sys
from lightning_ig import cli
base = ["diag", "--checkpoint", "c.safetensors", "--auto-samples", "3", "--num-steps", "4", "--output", "r.json"]
cases = [
    ["--checkpoint", "pipe.safetensors"],  # opening it would block forever
    ["--states", "zeros.npy"],  # a link to /dev/zero: reading it would never end
    ["--baseline", "folder"],
    ["--feature-names", "loop.json"],
    ["--feature-groups", "pipe.safetensors"],
    ["--checkpoint", "a" * 5000],
    ["--checkpoint", "pipe.safetensors", "--lightning-module", "tests.support.cli_lightning_module:TinyLightning"],
]
for case in cases:
    print(cli.main(base + case), flush=True)
"""


def test_every_input_path_is_refused_at_once_by_what_it_is(workspace: Path) -> None:
    os.mkfifo(workspace / "pipe.safetensors")
    (workspace / "zeros.npy").symlink_to("/dev/zero")
    (workspace / "folder").mkdir()
    (workspace / "loop.json").symlink_to("loop.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(  # a process of its own: before the check, the FIFO blocked the reader forever
        [sys.executable, "-c", _EVERY_INPUT_KIND],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.stdout.split() == ["2"] * 7 and len(lines) == 7, done.stderr
    words = [
        "--checkpoint 'pipe.safetensors' is a FIFO (a named pipe), not a regular file",
        "--states 'zeros.npy' is a device, not a regular file",
        "--baseline 'folder' is a folder, not a regular file",
        "--feature-names 'loop.json' is a symbolic-link loop",
        "--feature-groups 'pipe.safetensors' is a FIFO",
        "is too long for the file system (5,000 bytes)",
        "--checkpoint 'pipe.safetensors' is a FIFO",
    ]
    for line, expected in zip(lines, words):
        assert line.startswith("lightning-ig diag: error:") and expected in line, (expected, line)
    assert not (workspace / "r.json").exists()


def test_a_full_disk_while_writing_the_reports_leaves_none_of_them(
    workspace: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_ig.views.pictures.saliency
    import lightning_ig.views.report

    def full_disk(*args: object, **options: object) -> None:
        raise OSError(28, "No space left on device")

    written = lightning_ig.views.report.write_report
    calls = []

    def second_full(report: dict, path: Path, **options: bool) -> None:
        calls.append(path)
        if len(calls) == 2:
            full_disk()
        written(report, path, **options)

    monkeypatch.setattr(lightning_ig.views.report, "write_report", second_full)
    (workspace / "out").mkdir()
    code, out, err = _diag(capsys, "--checkpoint", "heads.safetensors", "--all-heads", "--output", "out/all.json")
    _refused(code, err, "(No space left on device)", "none of the 2 file(s) was written")
    assert list((workspace / "out").iterdir()) == [] and out == "", "--all-heads: all or none"
    monkeypatch.setattr(lightning_ig.views.report, "write_report", written)
    monkeypatch.setattr(lightning_ig.views.pictures.saliency, "write_png", full_disk)
    code, out, err = _diag(capsys, "--saliency", "sal/deep", "--output", "out/r.json")
    _refused(code, err, "cannot write --saliency picture 'sal/deep/saliency.png' (No space left on device)")
    assert list((workspace / "out").iterdir()) == [], "the report too"
    assert not (workspace / "sal").exists(), "nor the --saliency folder it made (an empty one was left)"


def test_a_saliency_folder_that_cannot_be_made_is_named(
    workspace: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The --saliency folder is made as the files are written; one that cannot be made then (the disk filled since the
    check) is named as the picture's, not blamed on --output, whose folder was there all along."""
    made = Path.mkdir

    def full_disk(self: Path, *args: object, **options: object) -> None:
        if self.name == "sal":
            raise OSError(28, "No space left on device", str(self))
        made(self, *args, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", full_disk)
    (workspace / "out").mkdir()
    code, out, err = _diag(capsys, "--saliency", "sal", "--output", "out/r.json")
    _refused(code, err, "cannot write --saliency picture 'sal/saliency.png' (No space left on device)")
    assert list((workspace / "out").iterdir()) == [] and not (workspace / "sal").exists() and out == ""


@pytest.mark.parametrize(
    ("step", "folder", "named"),
    [
        ("temporary", "out", "--output 'out/r.json'"),  # before any write: the first picture was blamed
        ("rename", "sal", "--saliency picture 'sal/saliency.png'"),  # after every write: the last file, the report
    ],
)
def test_a_folder_that_fails_at_the_write_is_named_by_its_own_file(
    workspace: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch, step: str, folder: str, named: str
) -> None:
    """A folder refusing files after the check (made read-only, a full file system) failed making a temporary,
    before any file was written, or a rename, after all were, and the line blamed the first planned file or the last:
    "cannot write --saliency picture 'sal/saliency.png'" where --output's folder failed. It names the file in the
    folder the error names."""
    import os
    import tempfile

    (workspace / "out").mkdir()
    failing = (workspace / folder).resolve()
    made, renamed = tempfile.mkstemp, os.replace

    def temporary(*args: object, dir: str, prefix: str, suffix: str) -> tuple[int, str]:  # noqa: A002 - its name
        if Path(dir) == failing and step == "temporary":
            raise PermissionError(13, "Permission denied", os.path.join(dir, f"{prefix}abc{suffix}"))
        return made(*args, dir=dir, prefix=prefix, suffix=suffix)  # type: ignore[call-overload]

    def rename(source: str, target: str) -> None:
        final = not Path(target).name.startswith(".")  # not a writer's own rename into its temporary
        if Path(target).parent == failing and final and step == "rename":
            raise PermissionError(13, "Permission denied", str(source))
        renamed(source, target)

    monkeypatch.setattr(tempfile, "mkstemp", temporary)
    monkeypatch.setattr(os, "replace", rename)
    code, out, err = _diag(capsys, "--saliency", "sal", "--output", "out/r.json")
    _refused(code, err, f"cannot write {named} (Permission denied)", "none of the 3 file(s)")
    assert list((workspace / "out").iterdir()) == [] and not (workspace / "sal").exists() and out == ""


def test_the_saliency_pictures_name_the_channels_the_groups_name(
    workspace: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_ig.views.pictures.saliency

    seen = {}
    for name in ("saliency_grid", "mean_abs_map"):
        drawn = getattr(lightning_ig.views.pictures.saliency, name)

        def spy(*args: object, _drawn: object = drawn, _name: str = name, **options: object) -> object:
            seen[_name] = options.get("channel_names", args[2] if len(args) > 2 else None)
            return _drawn(*args, **options)  # type: ignore[operator]

        monkeypatch.setattr(lightning_ig.views.pictures.saliency, name, spy)
    masks = {name: [[[other == name]] for other in ("paddle", "ball")] for name in ("paddle", "ball")}
    (workspace / "groups.json").write_text(json.dumps(masks))  # as the MinAtar example writes it
    code, _, err = _diag(capsys, "--feature-groups", "groups.json", "--saliency", "sal", "--output", "r.json")
    assert code == 0, err
    assert seen == {"saliency_grid": ["paddle", "ball"], "mean_abs_map": ["paddle", "ball"]}


def test_the_sample_flags_with_a_states_file_are_said_to_be_unused(workspace: Path, capsys: Capsys) -> None:
    states = torch.rand(4, *FRAME, generator=torch.Generator().manual_seed(2))
    np.save(workspace / "mine.npy", states.numpy())
    code, out, err = _diag(capsys, "--states", "mine.npy", "--seed", "7", "--replace", "--output", "a.json")
    assert code == 0, err
    assert json.loads((workspace / "a.json").read_text())["num_states"] == 4  # the file, whole
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: --auto-samples, --replace, --seed shape only the --states auto sample; --states mine.npy was used whole"
    ]
    code, out, err = _diag(capsys, "--seed", "7", "--output", "b.json")  # --states auto: they are used, no note
    assert code == 0 and "note:" not in out, err


def test_a_conv_network_given_flat_states_is_not_told_a_linear_layers_width(workspace: Path, capsys: Capsys) -> None:
    """Flat ``(N, F)`` states for a conv network: the error says the model rejects their shape, never "give states with
    N columns" from the width of the Linear layer after the convolutions (a conv network takes no width)."""
    np.save(workspace / "flat.npy", torch.rand(3, 32, generator=torch.Generator().manual_seed(3)).numpy())
    code, _, err = _diag(capsys, "--states", "flat.npy", "--output", "r.json")
    _refused(code, err, "the model fails on states of shape (3, 32)")
    assert "give states with" not in err and "features but the model takes" not in err
    assert not (workspace / "r.json").exists()


@pytest.mark.parametrize(
    ("flag", "value", "label", "words"),
    [
        ("--target", "mean", "target_label", "V(s)"),  # was: "V(s)" whatever --target attributed
        ("--target", "each", "target_label", "V(s)"),
        ("--target", "contrast", "target_label", "Q(greedy) − Q(runner-up)"),
        ("--target", "1", "target_label", "Q(s, 1)"),
        ("--baseline", "zeros", "baseline_label", "the all-zero frame"),  # was: that whatever --baseline was
        ("--baseline", "mean", "baseline_label", "the mean frame"),
        ("--baseline", "0.5", "baseline_label", "the baseline"),
    ],
)
def test_the_saliency_picture_names_what_was_attributed_against_which_baseline(
    workspace: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch, flag: str, value: str, label: str, words: str
) -> None:
    from lightning_ig.views.pictures import saliency

    labels: list[str] = []
    draw = saliency.saliency_grid
    monkeypatch.setattr(saliency, "saliency_grid", lambda *a, **k: labels.append(k[label]) or draw(*a, **k))
    assert _diag(capsys, flag, value, "--saliency", "sal", "--output", "r.json")[0] in (0, 4)
    assert labels == [words] and (workspace / "sal" / "saliency.png").is_file()


def test_a_path_flag_written_with_an_equals_sign_and_a_tilde_is_in_the_home_folder(
    workspace: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # guards against: the shell leaves "~" in "--checkpoint=~/c.safetensors"; inputs were read from the home folder
    # but compared with the outputs unexpanded, so "--output $HOME/c.safetensors" replaced the checkpoint with the
    # report (exit 0), "--output=~/r.json" looked for a folder "./~" and "--saliency=~/sal" made one
    home = workspace / "home"
    home.mkdir()
    (workspace / "c.safetensors").rename(home / "c.safetensors")
    (workspace / "work").mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(workspace / "work")
    before = _tree(workspace)
    code, _, err = _diag(capsys, "--checkpoint=~/c.safetensors", "--output", str(home / "c.safetensors"))
    _refused(code, err, "is also an input of this run")
    assert _tree(workspace) == before
    code, _, err = _diag(capsys, "--checkpoint=~/c.safetensors", "--output=~/r.json", "--saliency=~/sal")
    assert code in (0, 4), err
    assert (home / "r.json").is_file() and (home / "sal" / "saliency.png").is_file()
    assert list((workspace / "work").iterdir()) == [], "no folder named ~"
