"""Progress and interruption: the FID sampling of federate_ddpm shows a named progress bar, log lines
print above a progress bar (not onto it), and Ctrl-C ends a stage with one line and exit code 130."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from fedpipe import cli
from fedpipe.pipeline.federate_ddpm import sample_images
from fedpipe.tasks.diffusion import DiffusionTask

REPO = Path(__file__).resolve().parents[1]


class ZeroNoise(torch.nn.Module):
    """A noise predictor that always predicts 0, on 1x2x2 images."""

    in_shape = (1, 2, 2)

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, t, y=None):
        return torch.zeros_like(x) * self.w


def test_sample_shows_a_named_bar_only_when_asked(capsys):
    task = DiffusionTask(num_train_timesteps=5)
    gen = torch.Generator().manual_seed(0)
    task.sample(ZeroNoise(), 3, sampler="ddim", steps=2, generator=gen, progress=True,
                desc="final FID: 3 samples, ddim")
    assert "final FID: 3 samples, ddim" in capsys.readouterr().err
    task.sample(ZeroNoise(), 3, sampler="ddim", steps=2, generator=gen)
    assert capsys.readouterr().err == ""


def test_federate_ddpm_sampling_asks_for_a_bar_with_count_and_sampler():
    calls = []
    fake = SimpleNamespace(sample=lambda model, n, **kw: calls.append((n, kw)))
    cfg = SimpleNamespace(fid=SimpleNamespace(sampler="ddpm", ddim_steps=4, batch_size=8),
                          diffusion=SimpleNamespace(conditional=False, num_train_timesteps=10))
    sample_images(fake, None, 7, cfg, np.ones(2), torch.Generator(), "ddim", "FID curve")
    sample_images(fake, None, 5, cfg, np.ones(2), torch.Generator())
    (n1, kw1), (n2, kw2) = calls
    assert kw1["progress"] and kw1["desc"] == "FID curve: 7 samples, ddim" and kw1["steps"] == 4
    assert not kw2["progress"] and kw2["sampler"] == "ddpm" and kw2["steps"] == 10


def run_script(tmp_path: Path, body: str) -> subprocess.Popen:
    script = tmp_path / "stage.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "FEDPIPE_TRACKING": "off"}
    env.pop("FEDPIPE_THREADS", None)
    return subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)


def default_sigint() -> None:
    """The child gets Ctrl-C's default disposition, as in a terminal: a test run started in the
    background (``make test &``) inherits SIGINT ignored, and Python then installs no handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_log_lines_print_above_the_progress_bar(tmp_path):
    proc = run_script(tmp_path, """
        import logging, sys
        from tqdm import tqdm
        from fedpipe.cli import run_stage

        def main():
            bar = tqdm(total=4, desc="rounds", file=sys.stderr, mininterval=0, miniters=1)
            bar.update(2)
            logging.getLogger("fedpipe.algorithms.fedddpm").info("QuickTest after round 2: FID 9")
            bar.update(2)
            bar.close()

        run_stage(main)
    """)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = [ln for ln in err.split("\n") if "QuickTest after round 2" in ln]
    assert len(lines) == 1
    # the bar is cleared before the line (tqdm.write), so the line holds no bar text
    assert "%|" not in lines[0] and lines[0].split("\r")[-1].startswith("INFO fedpipe.algorithms")


def interrupt(tmp_path: Path, register: str) -> tuple[int, str]:
    proc = run_script(tmp_path, f"""
        import time
        from fedpipe.cli import keep_on_interrupt, run_stage

        def main():
            {register}
            print("ready", flush=True)
            time.sleep(60)

        run_stage(main)
    """)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_ctrl_c_prints_one_line_naming_what_is_kept_and_exits_130(tmp_path):
    rc, err = interrupt(tmp_path, 'keep_on_interrupt("checkpoint kept in data/checkpoints/x")')
    assert rc == cli.EXIT_INTERRUPTED == 130
    assert err.strip().splitlines() == [
        "interrupted: checkpoint kept in data/checkpoints/x; run `dvc repro` to resume"]


def test_ctrl_c_without_registration_says_nothing_partial_is_kept(tmp_path):
    rc, err = interrupt(tmp_path, "pass")
    assert rc == 130 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("interrupted: no partial result kept") and "dvc repro" in line


def test_training_stages_register_their_checkpoints():
    """The warm-up and the training skeleton (which the federate and federate_ddpm stages both run)
    say where an interrupted stage's checkpoints are."""
    src = REPO / "src" / "fedpipe" / "pipeline"
    for name in ("training.py", "warmup.py"):
        assert "keep_on_interrupt(" in (src / name).read_text(), name
    for name in ("federate.py", "federate_ddpm.py"):
        assert "from fedpipe.pipeline.training import" in (src / name).read_text(), name


def test_ctrl_c_to_the_process_group_stops_worker_processes_quietly(tmp_path):
    """A terminal's Ctrl-C reaches the stage and its worker processes: one line, exit 130, no
    worker's traceback, no wait for the running jobs."""
    script = tmp_path / "stage.py"
    script.write_text(textwrap.dedent("""
        import pathlib, time
        from fedpipe.cli import run_stage
        from fedpipe.pipeline.workers import map_in_processes

        def job(i):
            pathlib.Path(f"started_{i}").touch()
            time.sleep(120)
            return i

        def main():
            list(map_in_processes(job, [0, 1], 2))

        if __name__ == "__main__":
            run_stage(main)
    """))
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{tmp_path}",
           "FEDPIPE_TRACKING": "off"}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_sigint)
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"started_{i}").exists() for i in (0, 1)):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30  # the 120 s jobs were not waited for
    assert proc.returncode == 130 and "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    assert line.startswith("interrupted: no partial result kept")


def test_a_failed_workspace_experiment_says_how_to_get_back(tmp_path, monkeypatch, capsys):
    """`dvc exp run -S dataset=mnist` without the files: DVC has written the experiment's
    params.yaml and deleted the partition outputs; the error says how to return to the last commit,
    only where that applies (not under `dvc repro`, not in a queued experiment's temporary copy)."""
    import pytest

    from fedpipe.config import ConfigError

    def main():
        raise ConfigError("dataset.name", "nope", "digits, mnist")

    def stderr_lines() -> list[str]:
        with pytest.raises(SystemExit) as exit_:
            cli.run_stage(main)
        assert exit_.value.code == cli.EXIT_CONFIG
        return capsys.readouterr().err.strip().splitlines()

    monkeypatch.delenv("FEDPIPE_THREADS", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    assert len(stderr_lines()) == 1  # dvc repro: the params are the user's own
    monkeypatch.setenv("DVC_EXP_NAME", "lr0.1")
    error, hint = stderr_lines()
    assert error.startswith("error: invalid config: dataset.name=")
    assert hint.startswith("hint:") and "`git checkout params.yaml dvc.lock && dvc repro`" in hint
    queued = tmp_path / ".dvc" / "tmp" / "exps" / "tmpx1"
    queued.mkdir(parents=True)
    monkeypatch.chdir(queued)
    assert len(stderr_lines()) == 1
