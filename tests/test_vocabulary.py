"""The shared words and checks: one message for one mistake, a value of the wrong kind never read as another."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lightning_ig import vocabulary
from lightning_ig.vocabulary import (
    BACKENDS,
    GRADIENTS,
    METHODS,
    callable_name,
    check_bool,
    check_choice,
    check_feature_names,
    check_int,
    check_int_sequence,
    check_mapping,
    check_memory,
    check_n_steps,
    check_names,
    check_optional_positive_int,
    check_path,
    check_positive_float,
    check_positive_int,
    check_real,
    check_text,
    default_feature_names,
    relative_error_text,
    shown,
    shown_with_type,
)


def test_the_vocabulary_imports_neither_torch_nor_anything_that_does() -> None:
    code = "import sys, lightning_ig.vocabulary; print('torch' in sys.modules or 'numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_names_every_layer_shares() -> None:
    assert BACKENDS == ("auto", "cuda", "torch") and GRADIENTS == ("autograd", "finite_difference")
    assert METHODS[-1] == "gausslegendre" and len(METHODS) == len(set(METHODS)) == 5


def test_shown_quotes_a_value_cut_short_and_never_raises() -> None:
    assert shown("abc") == "'abc'"
    long = shown("x" * 500)
    assert len(long) <= 120 and "..." in long
    assert len(shown("x" * 500, width=20)) == 20 and shown("x" * 500, width=20).endswith("...")
    assert shown(list(range(10**6))).count(",") <= 8  # abbreviated as it is written, not after
    assert 0 < len(shown(10**5000)) <= 120  # past Python's digit limit (3.11+) it is named, not raised
    assert shown_with_type([1]) == "list ([1])"


def test_check_bool_refuses_truthy_things() -> None:
    assert check_bool(True, "flag") is True and check_bool(np.bool_(False), "flag") is False
    for value in ("no", 1, 0.0, None):
        with pytest.raises(TypeError, match=r"flag must be True or False, got"):
            check_bool(value, "flag")


def test_integers_are_ints_in_range_and_a_bool_is_not_a_number() -> None:
    assert check_int(np.int64(3), "n", minimum=0, maximum=3) == 3 and type(check_int(np.int64(3), "n")) is int
    with pytest.raises(ValueError, match="n must be an int >= 0 and <= 3, got 4"):
        check_int(4, "n", minimum=0, maximum=3)
    with pytest.raises(ValueError, match="n must be an int <= 3, got 4"):
        check_int(4, "n", maximum=3)
    for value in (True, 2.0, "2"):
        with pytest.raises(TypeError, match="n must be an int, got"):
            check_int(value, "n")
    assert check_positive_int(5, "k") == 5 and check_optional_positive_int(None, "k") is None
    with pytest.raises(ValueError, match="k must be an int >= 1, got 0; e.g. k=10"):
        check_positive_int(0, "k", example=10)
    assert check_int_sequence((1, 2), "ids", minimum=0) == [1, 2]
    with pytest.raises(TypeError, match="ids must be a list of ints"):
        check_int_sequence("12", "ids")
    with pytest.raises(ValueError, match=r"ids\[1\] must be an int >= 0, got -1"):
        check_int_sequence([0, -1], "ids", minimum=0)


def test_reals_are_finite_numbers_within_open_bounds() -> None:
    assert check_real(1, "x") == 1.0 and check_positive_float(0.5, "tol") == 0.5
    with pytest.raises(ValueError, match="x must be a finite number > 0 and < 1, got 1"):
        check_real(1, "x", above=0, below=1)
    for value in (math.nan, math.inf):
        with pytest.raises(ValueError, match="tol must be a finite number > 0"):
            check_positive_float(value, "tol")
    with pytest.raises(ValueError, match="x must be a finite number, got an int of 400 digits"):
        check_real(10**399, "x")
    with pytest.raises(TypeError, match="x must be a number, got bool"):
        check_real(True, "x")


def test_a_number_read_as_text_is_refused_saying_so() -> None:
    """A YAML 1.1 loader (PyYAML's ``safe_load``) reads ``tol: 1e-3`` as the text '1e-3' (it wants ``1.0e-3``): the
    error said only "must be a number, got str ('1e-3')", of what reads as a number."""
    for text in ("1e-3", "0.01", " -2.5E+4 ", ".5"):
        with pytest.raises(TypeError, match=r"^x must be a number, got str \(.*\): a number written as text .*1\.0e-3"):
            check_real(text, "x")
    for text in ("abc", "1e", "0.01%", "nan"):
        with pytest.raises(TypeError, match=r"^x must be a number, got str \('[^']*'\)$"):
            check_real(text, "x")


def test_choices_and_steps() -> None:
    assert check_choice("torch", BACKENDS, "backend") == "torch"
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'cuda', 'torch'; got 'triton'"):
        check_choice("triton", BACKENDS, "backend")
    with pytest.raises(TypeError, match="backend must be one of .* got int"):
        check_choice(1, BACKENDS, "backend")
    assert check_n_steps("auto") == "auto" and check_n_steps(7) == 7
    with pytest.raises(ValueError, match="n_steps must be an int >= 1, 'budget' or 'auto', got 'many'"):
        check_n_steps("many")
    with pytest.raises(ValueError, match="n_steps must be an int >= 1, got 0; e.g. n_steps=64"):
        check_n_steps(0)


def test_texts_paths_and_mappings() -> None:
    assert check_text("a", "name") == "a" and check_path("out.json", "output") == Path("out.json")
    with pytest.raises(ValueError, match="name must not be blank"):
        check_text("  ", "name")
    with pytest.raises(ValueError, match="output must be a non-empty path"):
        check_path("", "output")
    with pytest.raises(TypeError, match="output must be a path"):
        check_path(3, "output")
    assert check_mapping({"a": 1}, "extra") == {"a": 1}
    with pytest.raises(TypeError, match="extra must have string keys, got the key int"):
        check_mapping({1: 1}, "extra")


def test_names_are_one_printable_distinct_string_per_feature() -> None:
    assert check_names(("a", "b"), "names") == ["a", "b"]
    with pytest.raises(TypeError, match=r"names must be a list of strings, got str \('ab'\); for one name pass"):
        check_names("ab", "names")
    assert check_feature_names(["x", "y"], 2) == ["x", "y"]
    for names, words in (
        (["x"], "has 1 names but there are 2 features"),
        (["x", " "], r"feature_names\[1\] is blank"),
        (["x", "a\nb"], "holds a line break or control character"),
        (["x", "x"], r"repeats \['x'\]"),
    ):
        with pytest.raises(ValueError, match=words):
            check_feature_names(names, 2)


def test_default_feature_names_are_one_form_in_row_major_order() -> None:
    assert default_feature_names((3,)) == ["x0", "x1", "x2"] and default_feature_names(()) == ["x0"]
    assert default_feature_names((2, 2)) == ["x[0,0]", "x[0,1]", "x[1,0]", "x[1,1]"]


def test_the_completeness_error_is_written_as_a_fraction() -> None:
    assert relative_error_text(0.00376) == "3.76e-03"
    assert relative_error_text(math.inf) == "inf" and relative_error_text(math.nan) == "nan"


def test_callable_names_read_like_the_code() -> None:
    def value(x: object) -> object:
        return x

    class Forward:
        def __call__(self, x: object) -> object:
            return x

    assert callable_name(value) == "test_callable_names_read_like_the_code.<locals>.value"
    assert callable_name(Forward()) == "Forward"


def test_memory_a_user_sized_is_refused_before_it_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vocabulary, "available_memory", lambda: 3 * 2**30)
    check_memory(2**30, "--auto-samples 100", "ask for fewer")  # fits: nothing said
    with pytest.raises(
        ValueError, match=r"--auto-samples 10\*\*9 needs about 16\.0 GiB of memory, more than the 3\.0 GiB"
    ) as refused:
        check_memory(16 * 2**30, "--auto-samples 10**9", "ask for fewer")
    # was: no word of swap, where a machine with 16 GiB more of it could run this (slowly): the figure is memory alone
    assert "available here (swap not counted: " in str(refused.value)
    # was: "... slowed, and so is the training beside it", said by diag and the engine too, where nothing trains
    assert "training" not in str(refused.value)
    monkeypatch.setattr(vocabulary, "available_memory", lambda: None)  # a system that does not say: no bound
    check_memory(2**60, "anything", "ask for fewer")


def test_the_memory_available_is_a_positive_figure_here() -> None:
    available = vocabulary.available_memory()
    assert available is None or available > 0


_UNDER_ULIMIT = """
import resource
from pathlib import Path
from lightning_ig.vocabulary import available_memory
free = available_memory()
mapped = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
              if line.startswith("VmSize:"))
cap = mapped + free // 4  # ulimit -v: a quarter of what is free beyond what this process has mapped
resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
print(free, cap, available_memory())
"""


@pytest.mark.skipif(
    not Path("/proc/self/limits").exists(), reason="Linux's /proc: where the address space's cap is read"
)
def test_the_memory_available_is_bounded_by_ulimit_v() -> None:
    # was: the system's available memory under any ulimit -v, so a check passed and torch's allocator failed later
    # (a RuntimeError minutes into a fit) at memory the cap refused
    found = subprocess.run([sys.executable, "-c", _UNDER_ULIMIT], capture_output=True, text=True, check=True)
    free, cap, available = map(int, found.stdout.split())
    assert 0 < available <= free // 4 < cap


def _read_only(monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    """``vocabulary`` reads ``files`` (a path's text; the dict may change later) and nothing else."""

    def read(path: str, encoding: str) -> io.StringIO:
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return io.StringIO(files[path])

    monkeypatch.setattr(vocabulary, "open", read, raising=False)


@pytest.mark.parametrize(
    ("limit", "usage", "stat"),
    [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat"),  # cgroup v2
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
            "/sys/fs/cgroup/memory/memory.stat",
        ),
    ],
)
def test_a_containers_page_cache_is_memory_available(
    monkeypatch: pytest.MonkeyPatch, limit: str, usage: str, stat: str
) -> None:
    # was: a container's usage counts the page cache, full once a data set was read (3.9 of its 4 GiB here, 3 GiB of
    # it idle files), and 0.1 GiB read as available: the callback refused at fit start a fit that fits
    gib = 2**30
    files = {
        "/proc/meminfo": f"MemTotal: {64 * gib // 1024} kB\nMemAvailable: {48 * gib // 1024} kB\n",
        limit: f"{4 * gib}\n",
        usage: f"{4 * gib - gib // 10}\n",
        stat: f"anon {gib - gib // 10}\nfile {3 * gib}\nactive_file 0\ninactive_file {3 * gib}\n"
        f"total_inactive_file {3 * gib}\n",  # v1's figure for this cgroup and those below it (a leaf: the same)
    }
    _read_only(monkeypatch, files)  # this container's /proc and /sys, on any machine
    assert vocabulary.available_memory() == 3 * gib + gib // 10
    del files[stat]  # a kernel that does not say: only what is free of the limit
    assert vocabulary.available_memory() == gib // 10


def test_the_cgroup_v2_limits_are_read_where_this_process_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # was: only /sys/fs/cgroup/memory.max, the root's, was read; a process in a systemd slice or a nested container
    # (its cgroup named in /proc/self/cgroup) saw its host's 48 GiB, passed the check and was ended by the OOM killer
    gib, slice_ = 2**30, "/sys/fs/cgroup/user.slice/"
    files = {
        "/proc/meminfo": f"MemTotal: {64 * gib // 1024} kB\nMemAvailable: {48 * gib // 1024} kB\n",
        "/proc/self/cgroup": "0::/user.slice/run.scope\n",
        slice_ + "memory.max": f"{4 * gib}\n",  # the slice: 4 GiB for all below it, 3 GiB taken, 1 GiB of it idle files
        slice_ + "memory.current": f"{3 * gib}\n",
        slice_ + "memory.stat": f"anon {2 * gib}\nfile {gib}\nactive_file 0\ninactive_file {gib}\n",
        slice_ + "run.scope/memory.max": "max\n",  # this process's own: no limit of its own
        slice_ + "run.scope/memory.current": f"{gib}\n",
    }
    _read_only(monkeypatch, files)
    assert vocabulary.available_memory() == 2 * gib  # the slice's 4 GiB less its 2 GiB in use
    files[slice_ + "run.scope/memory.max"] = f"{gib + gib // 2}\n"  # a tighter limit below: the least left is taken
    assert vocabulary.available_memory() == gib // 2
    files["/proc/self/cgroup"] = "0::/\n"  # a container's own cgroup namespace: its root's files, none here
    assert vocabulary.available_memory() == 48 * gib


def test_the_cgroup_v1_limits_are_read_where_this_process_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # was: under cgroup v1 (RHEL 8's default) only /sys/fs/cgroup/memory/memory.limit_in_bytes, the root's, was read:
    # a SLURM job given 8 GiB of a 256 GiB node (its memory cgroup in /proc/self/cgroup) passed every memory check and
    # was ended by the out-of-memory killer, where the README says this process's cgroup and those above it count
    gib, job = 2**30, "/sys/fs/cgroup/memory/slurm/uid_1000/job_7/"
    files = {
        "/proc/meminfo": f"MemTotal: {256 * gib // 1024} kB\nMemAvailable: {200 * gib // 1024} kB\n",
        "/proc/self/cgroup": "5:cpu,cpuacct:/slurm/uid_1000/job_7\n4:memory:/slurm/uid_1000/job_7/step_0\n0::/\n",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",  # the root: no limit
        "/sys/fs/cgroup/memory/memory.usage_in_bytes": f"{56 * gib}\n",
        job + "memory.limit_in_bytes": f"{8 * gib}\n",  # the job: 8 GiB, 5 GiB of it taken, 1 GiB of that idle files
        job + "memory.usage_in_bytes": f"{5 * gib}\n",
        # v1's inactive_file is the job's own pages' (its step's are charged to the step); total_ counts them all
        job + "memory.stat": f"cache {gib}\nrss {4 * gib}\ninactive_file 0\ntotal_inactive_file {gib}\n",
        job + "step_0/memory.limit_in_bytes": "9223372036854771712\n",  # the step, where this process is: no limit
        job + "step_0/memory.usage_in_bytes": f"{4 * gib}\n",
    }
    _read_only(monkeypatch, files)
    assert vocabulary.available_memory() == 4 * gib  # the job's 8 GiB less its 4 GiB in use
    files["/proc/self/cgroup"] = "4:memory:/\n0::/\n"  # a container's own memory cgroup, mounted as the root
    assert vocabulary.available_memory() == 200 * gib


def test_names_that_look_alike_are_one_name() -> None:
    nfc, nfd = "caf\u00e9", "cafe\u0301"  # the same text, composed and decomposed
    assert nfc != nfd
    with pytest.raises(ValueError, match="repeats .* \\(names that look alike are one name\\)"):
        check_feature_names([nfc, nfd], 2)
    with pytest.raises(ValueError, match="names that look alike"):
        check_names(["x", nfd, nfc], "group_names")


def test_a_path_starting_with_a_tilde_is_in_the_home_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert check_path("~/runs/x", "report_dir") == tmp_path / "runs" / "x"
    assert check_path(Path("~"), "report_dir") == tmp_path
    assert check_path("a~/b", "report_dir") == Path("a~/b")  # only a leading ~ is the home folder
    with pytest.raises(ValueError, match="report_dir holds a NUL character"):
        check_path("a\x00b", "report_dir")


def test_numpy_integers_are_counts_as_python_ints_are() -> None:
    assert check_positive_int(np.int64(2), "every_n_steps") == 2 and type(check_positive_int(np.int64(2), "n")) is int
    assert check_int(np.uint8(3), "k", minimum=0) == 3 and check_n_steps(np.int32(16)) == 16
    assert check_int_sequence([np.int64(1), 2], "indices") == [1, 2]


def test_a_blank_action_or_group_name_is_not_called_a_feature():
    """check_names checks action_names and group_names too: the blank one is told as what it names."""
    with pytest.raises(ValueError, match=r"action_names\[1\] is blank") as error:
        check_names(["left", ""], "action_names")
    assert "feature" not in str(error.value)
