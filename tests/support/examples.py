"""Running the examples as a user does (a subprocess with this checkout on the path), or importing one as a module."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from tests.support import REPO

# How a run stopped after its folder was made, the status main exits with (None: the error propagates) and its words
STOPS = [
    (RuntimeError("boom"), None, "failed (RuntimeError)"),
    (SIGTERMException(), 143, "was stopped (SIGTERM)"),  # Lightning's: a SystemExit without a code, which exited 0
    (KeyboardInterrupt(), 130, "was stopped (Ctrl-C)"),
]

# Bad values both examples refuse in the same words: their argument helpers are one copy in each single-file script.
SHARED_BAD_FLAGS = [
    (["--learning-starts", "900", "--total-timesteps", "500"], "--learning-starts must be in [0, --total-timesteps)"),
    (["--learning-rate", "0"], "--learning-rate must be > 0, got 0.0"),
    (["--ig-overhead", "2%"], "argument --ig-overhead: must be in (0, 1] or 'none', got 2%"),
    # seed_everything's range, said before a traceback
    (["--seed", "-1"], "argument --seed: must be in [0, 4294967295], got -1"),
    (["--seed", "4294967296"], "argument --seed: must be in [0, 4294967295], got 4294967296"),
    # nan and inf pass a comparison with a bound (nan < 0 is False): refused for every float option
    (["--sigma0", "nan"], "argument --sigma0: must be a finite number >= 0.0, got nan"),
    (["--max-grad-norm", "inf"], "argument --max-grad-norm: must be a finite number >= 0.0, got inf"),
    (["--aux-coef=-inf"], "argument --aux-coef: must be a finite number >= 0.0, got -inf"),
    # what the library refuses, in its words, before the run: not a traceback when the callback is built
    (["--ig-n-steps", "99999999999999"], "argument --ig-n-steps: n_steps=99999999999999 needs about"),
    (["--ig-n-steps", "\N{SUPERSCRIPT TWO}"], "--ig-n-steps: must be a whole number >= 1, 'budget' or 'auto'"),
    (["--exp-name", "a/b"], "argument --exp-name: must not contain a path separator ('/')"),
]


def example_env() -> dict[str, str]:
    """The environment of an example run: headless matplotlib, the checkout first on the path."""
    env = dict(os.environ)
    env["MPLBACKEND"] = "Agg"
    # The package may be installed or only on the path of a checkout.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def run_python(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``cwd``; the caller checks the return code."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=example_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def only_run_dir(runs: Path) -> Path:
    """The one run folder an example wrote under ``runs``."""
    run_dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(run_dirs) == 1, f"expected one run folder in {runs}, found {run_dirs}"
    return run_dirs[0]


def load_example(path: Path, name: str) -> ModuleType:
    """The example script at ``path`` imported as module ``name`` (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def assert_gpu_refused_without_a_gpu(
    example: ModuleType,
    script: str,
    runs: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--accelerator gpu`` where torch sees no GPU: exit 2 with the example's one-line error, nothing made first."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--accelerator", "gpu", "--runs-dir", str(runs)])
    assert exit_info.value.code == 2
    assert f"{script}: error: --accelerator gpu, but torch sees no CUDA GPU" in capsys.readouterr().err
    assert not runs.exists(), "nothing is made before the message"


def assert_refused_at_parse(
    module: ModuleType, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example's ``parse_args(flags)`` exits 2 with ``message`` on stderr."""
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def assert_mlflow_refuses_exp_name(module: ModuleType, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--logger mlflow`` refuses an experiment name MLflow cannot search for (an empty one, a quote) at parse time,
    where TensorBoard takes it (MLflow's search failed on it after the run folder was made)."""
    from tests.support.loggers import logger_package

    logger_package("mlflow")
    assert_refused_at_parse(
        module,
        ["--logger", "mlflow", "--exp-name", name],
        "error: --logger mlflow takes no empty --exp-name nor one with a single quote",
        capsys,
    )
    assert module.parse_args(["--exp-name", name]).exp_name == name  # TensorBoard takes both


def assert_mlflow_logger_starts_quietly(module: ModuleType, runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--logger mlflow`` on a fresh store (every run's default) makes its experiment without Lightning's warning
    "Experiment with name ... not found. Creating it." (the first line such a run printed)."""
    import logging

    from tests.support.loggers import logger_package

    logger_package("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what the example sets for its file store, undone after
    said: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = said.append  # type: ignore[method-assign]
    lightning_log = logging.getLogger("lightning.pytorch.loggers.mlflow")
    lightning_log.addHandler(handler)
    try:
        args = module.parse_args(["--logger", "mlflow", "--runs-dir", str(runs)])
        logger = module.make_logger(args, "run", runs / "run")
    finally:
        lightning_log.removeHandler(handler)
    assert [record.getMessage() for record in said] == []
    assert logger.experiment.get_experiment(logger.experiment_id).name == args.exp_name


def assert_mlflow_takes_a_plain_path(module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--mlflow-tracking-uri my store`` (a path, as MLflow's own examples write ``./mlruns``) is the file store
    there: the run starts (MLflow 3 refused it, a traceback, without the file-store switch the example sets for
    ``file:`` URIs) and the closing ``mlflow ui`` line names it in full."""
    from tests.support.loggers import logger_package

    logger_package("mlflow")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # recorded, so that what the example sets is undone after
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    args = module.parse_args(["--logger", "mlflow", "--mlflow-tracking-uri", "my store"])
    run_dir = tmp_path / "runs" / "run"
    logger = module.make_logger(args, "run", run_dir)
    assert logger.experiment.get_experiment(logger.experiment_id).name == args.exp_name
    assert (tmp_path / "my store").is_dir()
    words = shlex.split(module.close_logger(logger, args, run_dir))
    assert words[-2:] == ["--backend-store-uri", (tmp_path / "my store").as_uri()]


def assert_mlflow_unreachable_says_so(
    module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--mlflow-tracking-uri http://...`` where nothing answers: a line says the example is connecting before MLflow
    retries, then the example's one-line error naming the flag and the URI, exit 2 (not MLflow's traceback)."""
    import socket

    from tests.support.loggers import logger_package

    logger_package("mlflow")
    with socket.socket() as free:  # a port bound then released: nothing listens there
        free.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{free.getsockname()[1]}"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retries would take minutes
    args = module.parse_args(["--logger", "mlflow", "--mlflow-tracking-uri", uri])
    with pytest.raises(SystemExit) as stop:
        module.make_logger(args, "run", tmp_path / "runs" / "run")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"connecting to the MLflow tracking server {uri}" in err
    assert f"error: --mlflow-tracking-uri {uri}: MLflow cannot reach it" in err
    assert "Traceback" not in err


def assert_mlflow_refusing_is_not_unreachable(
    module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tracking server that answers but refuses (401: a login it needs) is said with its own words, not as one that
    cannot be reached, to be started."""
    import http.server
    import threading

    from tests.support.loggers import logger_package

    class Refuses(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error_code": "UNAUTHENTICATED", "message": "You must be logged in"}')

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    logger_package("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with http.server.HTTPServer(("127.0.0.1", 0), Refuses) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        uri = f"http://127.0.0.1:{server.server_port}"
        args = module.parse_args(["--logger", "mlflow", "--mlflow-tracking-uri", uri])
        try:
            with pytest.raises(SystemExit) as stop:
                module.make_logger(args, "run", tmp_path / "runs" / "run")
        finally:
            server.shutdown()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"error: --mlflow-tracking-uri {uri}: MLflow refused (UNAUTHENTICATED: You must be logged in)" in err, err
    assert "cannot reach" not in err and "start the server" not in err and "Traceback" not in err


def assert_wandb_without_login_says_what_to_do(example: Path, tmp_path: Path) -> None:
    """``--logger wandb`` with no W&B key and no ``WANDB_MODE=offline``: the example's one-line error naming the flag,
    ``wandb login`` and ``WANDB_MODE=offline``, exit 2, not wandb's ``UsageError`` traceback."""
    from tests.support.loggers import logger_package

    logger_package("wandb")
    env = example_env()
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        env.pop(name, None)
    empty = tmp_path / "home"  # no ~/.netrc, no W&B settings: a user who never ran `wandb login`
    env.update(HOME=str(empty), NETRC=str(empty / ".netrc"), WANDB_CONFIG_DIR=str(empty / "wandb"))
    env.update(WANDB_CACHE_DIR=str(empty / "cache"), WANDB_DATA_DIR=str(empty / "data"), WANDB_SILENT="true")
    argv = ["--logger", "wandb", "--total-timesteps", "300", "--learning-starts", "200", "--runs-dir", "runs"]
    done = subprocess.run(
        [sys.executable, str(example), *argv],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,  # no terminal: wandb cannot ask for a key
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"{example.name}: error: --logger wandb cannot start the W&B run" in done.stderr
    assert "`wandb login`" in done.stderr and "WANDB_MODE=offline" in done.stderr


def stopped_in_evaluation(
    module: ModuleType, argv: list[str], runs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> dict[str, str]:
    """The example run with Ctrl-C in its closing evaluation: exit 130, the one line naming the saved checkpoint, and
    the checkpoint's metadata (without an evaluation return: none was measured)."""
    from lightning_ig.checkpoint import load_checkpoint

    def stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "evaluate", stopped)
    with pytest.raises(SystemExit) as raised:
        module.main([*argv, "--runs-dir", str(runs)])
    assert raised.value.code == 130
    checkpoint = only_run_dir(runs) / "q_network.safetensors"
    assert f"the run was stopped (Ctrl-C): {checkpoint.parent} holds only what it wrote before the error; its " in (
        capsys.readouterr().err
    )
    loaded = load_checkpoint(checkpoint)
    assert "eval_mean_return" not in loaded.metadata and loaded.states is not None
    return dict(loaded.metadata)
