"""Hostile inputs to `lightning-ig diag` / `show`: what a file holds is printed as text, and malformed JSON of any
depth, integers of any size and values of the wrong kind are one line and exit status 2, never a traceback.

In-process through `cli.main`, as tests/cli/test_diag.py runs the command.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from lightning_ig import cli

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202egnp.exe\u2028\udc80"
"""Retitles the window, clears it, a C1 CSI, a right-to-left override, a line separator, a lone surrogate."""


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line_error(code: int, err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    for word in words:
        assert word in lines[0], (word, lines[0])


def _report(workspace: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", "--output", "out/r.json")[0] == 0
    return json.loads((workspace / "out" / "r.json").read_text())


def _no_terminal_commands(text: str) -> None:
    for character in "\x1b\x07\x9b\u202e\u2028":
        assert character not in text, repr(character)
    text.encode("utf-8")  # no lone surrogate: printing it would have raised UnicodeEncodeError


# ------------------------------------------------------------------------------ what reaches the terminal


def test_show_prints_a_reports_strings_escaped(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # guards against: the feature name set the terminal's title and cleared the screen
    good = _report(workspace, capsys)
    good["features"][0]["name"] = good["top_10_by_mean_abs"][0]["name"] = HOSTILE
    good["checkpoint"], good["forward_target"] = HOSTILE, HOSTILE
    (workspace / "hostile.json").write_text(json.dumps(good))
    code, out, err = _main(capsys, "show", "hostile.json", "--top", "4")
    assert code == 0 and err == "", err
    _no_terminal_commands(out)
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in out  # what the file holds is shown, as text


def test_diag_prints_the_users_paths_escaped(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--output", "out/\x1b[2Jr.json")
    assert code == 0, err
    _no_terminal_commands(out + err)
    assert "wrote out/\\x1b[2Jr.json" in out


def test_an_error_quoting_a_file_is_escaped_and_cut_short(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--head", HOSTILE * 20)
    _one_line_error(code, err)
    _no_terminal_commands(err)
    assert "characters)" in err and len(err) < 600  # the 320-character head name is quoted by its start


# ------------------------------------------------------------------------------ malformed JSON of any kind

BOMB = "[" * 100_000
"""RecursionError in json.loads: was exit status 1, "unexpected failure (a bug)"."""


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bomb", BOMB),
        ("objects", '{"a": ' * 50_000),
        ("deep", "[" * 100 + "]" * 100),
        ("digits", "1" * 100_000),
        ("big_int", json.dumps({"schema_version": 1, "num_states": 10**30})),
    ],
)
def test_show_refuses_malformed_json_with_exit_2(
    workspace: Path, capsys: pytest.CaptureFixture[str], name: str, text: str
) -> None:
    (workspace / f"{name}.json").write_text(text)
    code, _, err = _main(capsys, "show", f"{name}.json")
    _one_line_error(code, err, f"{name}.json", "not readable JSON")


@pytest.mark.parametrize("flag", ["--feature-groups", "--feature-names"])
@pytest.mark.parametrize("text", [BOMB, '{"a": ' * 50_000, "[" * 100 + "]" * 100, "[" + "9" * 5000 + "]"])
def test_diag_refuses_malformed_json_files_with_exit_2(
    workspace: Path, capsys: pytest.CaptureFixture[str], flag: str, text: str
) -> None:
    (workspace / "input.json").write_text(text)
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", flag, "input.json")
    _one_line_error(code, err, flag, "input.json")


@pytest.mark.parametrize(
    "groups",
    [{"a": [0, 2**70]}, {"a": [0, 2**64 - 1]}, {"a": [-(2**70)]}, [0, 1, 2**70, 1], {"a": [0, 10**30]}],
)
def test_a_huge_index_in_a_groups_file_is_exit_2(workspace: Path, capsys: pytest.CaptureFixture[str], groups) -> None:
    # guards against: OverflowError, exit status 1
    (workspace / "groups.json").write_text(json.dumps(groups))
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", "--feature-groups", "groups.json")
    _one_line_error(code, err, "--feature-groups", "groups.json")


@pytest.mark.parametrize("text", [BOMB, '{"a": ' * 50_000, '{"state_dim": ' + "9" * 5000 + "}"])
def test_model_kwargs_of_any_depth_or_size_is_exit_2(
    workspace: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    model = "lightning_ig.models:DuelingQNetwork"
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--model", model, "--model-kwargs", text)
    _one_line_error(code, err, "--model-kwargs")


@pytest.mark.parametrize("config", [BOMB, '{"state_dim": ' + "9" * 5000 + "}"])
def test_a_checkpoint_whose_metadata_is_a_nesting_bomb_is_exit_2(
    workspace: Path, capsys: pytest.CaptureFixture[str], config: str
) -> None:
    tensors = load_file(workspace / "q.safetensors")
    metadata = {
        "lightning_ig.format": "1",
        "lightning_ig.architecture": "DuelingQNetwork",
        "lightning_ig.config": config,
    }
    save_file(tensors, workspace / "bomb.safetensors", metadata=metadata)
    code, _, err = _main(capsys, "diag", "--checkpoint", "bomb.safetensors", "--quiet")
    _one_line_error(code, err, "lightning_ig.config")


@pytest.mark.parametrize(
    ("rows", "word"), [([[True, False, 1.0, 2.0]], "a JSON boolean"), ([[1.0, "2", 3.0, 4.0]], "a JSON str")]
)
def test_states_that_are_not_numbers_are_refused(
    workspace: Path, capsys: pytest.CaptureFixture[str], rows: list, word: str
) -> None:
    # guards against: true/false were read as 1.0 and 0.0
    (workspace / "states.json").write_text(json.dumps({"states": rows}))
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", "--states", "states.json")
    _one_line_error(code, err, "states.json", word)


def test_states_json_of_any_depth_is_exit_2(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workspace / "states.json").write_text('{"states": ' + BOMB + "}")
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", "--states", "states.json")
    _one_line_error(code, err, "states.json")


# ------------------------------------------------------------------------------ values of the wrong kind


def test_show_refuses_a_schema_version_of_true(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # guards against: True == 1, so the report was shown as version 1
    good = _report(workspace, capsys)
    (workspace / "true.json").write_text(json.dumps({**good, "schema_version": True}))
    code, _, err = _main(capsys, "show", "true.json")
    _one_line_error(code, err, "schema_version True")


def test_show_refuses_a_negative_number_of_worst_states(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # guards against: -5 was taken, and listed nothing
    _report(workspace, capsys)
    code, _, err = _main(capsys, "show", "out/r.json", "--worst-states", "-5")
    _one_line_error(code, err, "--worst-states", "--worst-states must be an int >= 0, got -5")


def test_show_says_the_completeness_error_as_the_report_does(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _report(workspace, capsys)
    code, out, _ = _main(capsys, "show", "out/r.json")
    worst = good["completeness"]["worst_relative_error"]
    assert code == 0 and f"worst relative error {worst:.2e}" in out and "%" not in out  # a fraction, as in the JSON
    assert "head -" not in out and " head " not in out  # a single-model report has no head to name


def test_an_allocation_the_user_asked_for_that_fails_is_exit_2() -> None:
    # guards against: torch's CPU allocator raises a RuntimeError (e.g. --auto-samples 100000000000 --replace):
    # "unexpected",
    # exit status 1. Tested on the message: a real 800 GB allocation could be granted and then kill the machine.
    error = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
        "to allocate 800000000000 bytes"
    )
    status, line = cli._failure(error, "diag")
    assert status == 2 and "out of memory" in line and "--auto-samples" in line


def test_a_constant_baseline_past_the_models_dtype_is_exit_2(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: "unexpected RuntimeError: value cannot be converted to type float without overflow"
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", "--baseline", "1e308")
    _one_line_error(code, err, "--baseline '1e308' is not a finite torch.float32 number; give zeros, mean, a number")


@pytest.mark.parametrize(
    ("value", "said"),
    [(text, "is neither zeros, mean, a number nor an existing file") for text in ("1_0", " 3", "+3", "\u0663")]
    + [(text, "is not a finite torch.float32 number") for text in ("nan", "-inf", "Infinity")],
)
def test_a_constant_baseline_is_a_number_as_typed(
    value: str, said: str, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: float() read "1_0", " 3", "+3" and Arabic digits as numbers; nan and inf are said as before
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", f"--baseline={value}")
    _one_line_error(code, err, f"--baseline {value!r} {said}")


def test_a_baseline_file_of_the_wrong_shape_is_told_its_own_shape(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # guards against: a (1, 1, 4) file said to have shape (1, 4), a shape the flag takes
    (workspace / "b.json").write_text(json.dumps({"states": [[[0.1, 0.1, 0.1, 0.1]]]}))
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", "--baseline", "b.json")
    _one_line_error(
        code, err, "--baseline 'b.json' has shape (1, 1, 4); give one baseline as a file of states, shape (1, 4)"
    )
    (workspace / "b.json").write_text(json.dumps({"states": [[0.1, 0.1, 0.1, 0.1]]}))  # the shape it advises
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", "--baseline", "b.json")
    assert code == 0, err


@pytest.mark.parametrize("flag", ["--states", "--baseline"])
@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("b.json", '{"baseline": [[0, 0, 0, 0]]}', "error: {flag} 'b.json' has no \"states\" key"),
        ("./b.json", '{"baseline": [[0, 0, 0, 0]]}', "error: {flag} './b.json' has no \"states\" key"),
        ("n_steps=64/b.json", "{}", "error: {flag} 'n_steps=64/b.json' has no \"states\" key"),
        ("b.json", "{not json", "error: cannot read states from {flag} 'b.json' (JSONDecodeError"),
        ("b.json", "[1, 2, 3, 4]", "error: states in {flag} 'b.json' have shape (4,)"),
        ("b.npy", "not numpy", "error: {flag} 'b.npy' is not a .npy file"),
        ("b.txt", "1 2 3 4", "error: {flag} 'b.txt' must end in .json, .npy or .safetensors"),
    ],
)
def test_a_states_or_baseline_file_that_cannot_be_read_is_named_by_its_flag(
    workspace: Path, capsys: pytest.CaptureFixture[str], flag: str, name: str, text: str, words: str
) -> None:
    """The reader's words name a states file as such ("states file 'b.json' has no "states" key"): the line names the
    flag with the path as typed (--states 'b.json'), as every other flag's does, and the path stays as typed (a
    folder "n_steps=64" was read as the engine's option and said "--num-steps 64/b.json")."""
    (workspace / name).parent.mkdir(exist_ok=True)
    (workspace / name).write_text(text)
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", flag, name)
    _one_line_error(code, err, words.format(flag=flag))
    assert "states file" not in err, err


def test_a_states_file_found_beside_the_checkpoint_keeps_its_path_as_typed(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--states auto reading <name>.states.json beside a checkpoint in a sweep's folder "n_steps=64": the reader's
    error went through the rewrite of the engine's option names: "states file '--num-steps 64/q.states.json'"."""
    from lightning_ig.checkpoint import save_checkpoint
    from lightning_ig.models import DuelingQNetwork

    (workspace / "n_steps=64").mkdir()
    save_checkpoint(DuelingQNetwork(4, 3, hidden_sizes=(8,)), workspace / "n_steps=64" / "q.safetensors")
    (workspace / "n_steps=64" / "q.states.json").write_text("{}")
    code, _, err = _main(capsys, "diag", "--checkpoint", "n_steps=64/q.safetensors", "--quiet")
    _one_line_error(code, err, "error: states file 'n_steps=64/q.states.json' has no \"states\" key")
    assert "--num-steps" not in err, err


# ------------------------------------------------------------------------------ sizes and precisions


@pytest.mark.parametrize(
    "flags",
    [
        ["--auto-samples", "1000000000", "--replace"],  # was: killed by the out-of-memory killer, no message
        ["--auto-samples", "10", "--replace", "--num-steps", "1000000000000"],
    ],
)
def test_work_larger_than_the_memory_is_refused_before_it_is_allocated(
    workspace: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--output", "out/r.json", *flags)
    _one_line_error(code, err, f"{flags[0]} {flags[1]}", "of memory, more than the", "ask for fewer states or steps")
    assert not (workspace / "out" / "r.json").exists()


def test_the_steps_count_per_state(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_ig import vocabulary

    monkeypatch.setattr(vocabulary, "available_memory", lambda: 2**30)  # was: 32 B a step in all, then 25 GB allocated
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--num-steps", "10000000", "--quiet")
    _one_line_error(code, err, "--auto-samples 16 at --num-steps 10000000", "more than the 1.0 GiB available")


@pytest.mark.parametrize("steps", ["auto", "budget"])
def test_the_default_steps_are_sized_as_the_most_they_take(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, steps: str
) -> None:
    # guards against: --num-steps auto (the default) and budget were sized as no step at all, so a sample whose path
    # gradients (up to 512 or 256 steps a state) do not fit passed the check and met the out-of-memory killer
    from lightning_ig import vocabulary

    monkeypatch.setattr(vocabulary, "available_memory", lambda: 500_000)  # 16 states fit, their 256 steps do not
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--num-steps", steps, "--quiet")
    _one_line_error(code, err, f"--auto-samples 16 at --num-steps {steps}", "more than the 488.3 KiB available")


def test_the_states_of_a_file_are_bounded_as_sampled_ones_are(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_ig import vocabulary

    (workspace / "states.json").write_text(json.dumps({"states": [[0.5, 1.0, 2.0, 3.0]] * 200}))
    monkeypatch.setattr(vocabulary, "available_memory", lambda: 300_000)  # the file fits; 200 states' work does not
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--states", "states.json", "--quiet")
    _one_line_error(code, err, "the 200 states of --states 'states.json'", "more than the 293.0 KiB available")


def test_a_feature_names_file_holding_an_object_says_what_it_holds(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workspace / "object.json").write_text('{"a": "b"}')
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--feature-names", "object.json")
    _one_line_error(code, err, "--feature-names 'object.json' must be a list of strings", "got dict")
    assert "NoneType" not in err
    (workspace / "keyed.json").write_text('{"feature_names": ["p", "q", "r", "s"]}')  # the keyed form still reads
    code, _, err = _main(
        capsys, "diag", "--checkpoint", "q.safetensors", "--feature-names", "keyed.json", "--output", "out/k.json"
    )
    assert code == 0, err
    assert [row["name"] for row in json.loads((workspace / "out" / "k.json").read_text())["features"]] == list("pqrs")


def test_a_model_of_two_precisions_is_one_line_naming_them(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.cli_models import MixedPrecision

    save_file(MixedPrecision(4, 3).state_dict(), str(workspace / "mixed.safetensors"))
    (workspace / "states.json").write_text(json.dumps({"states": [[0.5, 1.0, 2.0, 3.0]]}))
    code, _, err = _main(
        capsys,
        "diag",
        "--checkpoint",
        "mixed.safetensors",
        "--model",
        "tests.support.cli_models:MixedPrecision",
        "--model-kwargs",
        '{"width": 4, "actions": 3}',
        "--states",
        "states.json",
        "--output",
        "out/r.json",
    )
    _one_line_error(code, err, "the model's parameters are of 2 dtypes (torch.float32, torch.float64")


def test_a_failing_run_leaves_no_saliency_folder(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--saliency to a new nested folder on a run that fails (an MLP's flat states cannot be drawn) leaves no folder:
    it is made once the reports are ready to write (it used to be made when the outputs were checked, first)."""
    code, _, err = _main(
        capsys, "diag", "--checkpoint", "q.safetensors", "--saliency", "pictures/nested", "--output", "out/r.json"
    )
    _one_line_error(code, err, "--saliency draws states with spatial dimensions")
    assert not (workspace / "pictures").exists()
    assert not (workspace / "out" / "r.json").exists()


def test_states_with_an_extra_dimension_for_an_mlp_are_told_to_check_their_feature_shape(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3-D states ``(N, 2, 4)`` for an MLP of 4 inputs: the model runs and returns ``(2, 2, A)`` on diag's probe of two
    states; the error says to check that the states' feature shape is the model's, not only the shapes diag needs."""
    np.save(workspace / "three.npy", torch.rand(3, 2, 4, generator=torch.Generator().manual_seed(3)).numpy())
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--states", "three.npy", "--quiet")
    _one_line_error(code, err, "the model returns shape (2, 2, 3) per batch", "check that the states' feature shape")


def test_states_too_narrow_for_one_head_of_all_heads_name_that_head(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--all-heads with one --states file over heads of 4 and 5 inputs: the error says which head takes 5."""
    from lightning_ig.checkpoint import save_merged_checkpoint
    from lightning_ig.models import DuelingQNetwork

    heads = {"four": DuelingQNetwork(4, 2, hidden_sizes=(8,)), "five": DuelingQNetwork(5, 2, hidden_sizes=(8,))}
    save_merged_checkpoint(heads, workspace / "widths.safetensors")
    args = ("diag", "--checkpoint", "widths.safetensors", "--all-heads", "--states", "held_out.json", "--quiet")
    code, _, err = _main(capsys, *args, "--output", "out/r.json")
    _one_line_error(code, err, "have 4 features but the model takes 5 (head 'five' of widths.safetensors)")


def test_the_default_sample_of_a_checkpoint_with_fewer_states_takes_them_all(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint that stores 5 states: ``diag`` with no ``--auto-samples`` attributes all 5 (it stopped with exit 2,
    "--auto-samples 16 is more than the 5 states stored", a number the user never gave); one asked for is still
    refused."""
    from lightning_ig.checkpoint import load_checkpoint, save_checkpoint

    loaded = load_checkpoint("q.safetensors")
    assert loaded.states is not None
    save_checkpoint(loaded.model, workspace / "few.safetensors", states=loaded.states[:5])
    code, _, err = _main(capsys, "diag", "--checkpoint", "few.safetensors", "--quiet", "--output", "out/few.json")
    assert code == 0, err
    report = json.loads((workspace / "out" / "few.json").read_text())
    assert (report["num_states"], report["state_indices"]) == (5, [0, 1, 2, 3, 4])
    code, _, err = _main(capsys, "diag", "--checkpoint", "few.safetensors", "--auto-samples", "16", "--quiet")
    _one_line_error(code, err, "--auto-samples 16 is more than the 5 states stored")


def test_target_each_is_sized_for_every_actions_path_gradients(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # guards against: --target each keeps a path gradient per action (the model's 3 here, 18 on Atari) but was sized
    # as one, so 100 states of 10,000 features passed the check and were killed by the kernel at 24 GB, a minute in
    from lightning_ig import vocabulary

    monkeypatch.setattr(vocabulary, "available_memory", lambda: 2_000_000)  # 16 states' V(s) fit, their 3 actions not
    assert _main(capsys, "diag", "--checkpoint", "q.safetensors", "--quiet", "--output", "out/r.json")[0] == 0
    code, _, err = _main(capsys, "diag", "--checkpoint", "q.safetensors", "--target", "each", "--output", "out/e.json")
    _one_line_error(code, err, "--target each (3 actions) at --num-steps auto", "more than the 1.9 MiB")
    assert not (workspace / "out" / "e.json").exists()
