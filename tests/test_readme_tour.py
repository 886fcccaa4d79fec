"""The README's command blocks, run as written, so that the README cannot drift from the project.

In a copy of the repository (its tracked and untracked-but-not-ignored files, committed) with the
diffusion track's settings shrunk in ``conf/`` (as the end-to-end pipeline test does, so that every
command composes them too): the quick start's ``make run`` (with this test's environment as
``.venv``: the Makefile's install step is marked done, nothing is installed), then every command of
the "Running experiments" block in order, each of which must exit 0. ``dvc queue status`` is polled
until the queue is idle, as the README says; ``<name>`` is the name of the last queued experiment.
``make test`` is this suite; the other make targets the README names must exist. The README's
``dvc exp show`` recipe must fit 120 columns and show main's metrics (the summary metrics are in
git: the copy commits the ``make run`` results, as the README says to)."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import pytest
from repo_copy import BIN, REPO, commit_all, copy_repo, sh
from test_pipeline import shrink_diffusion_track

README = REPO / "README.md"


def section_commands(title: str, readme: str | None = None) -> list[str]:
    """The commands of the ```bash blocks under the README heading ``## <title>``, one per line,
    comments (shell's own rule: an unquoted ``#`` after a blank) and comment-only lines dropped."""
    text = README.read_text() if readme is None else readme
    body = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```bash\n(.*?)```", body, flags=re.S):
        for line in block.splitlines():
            tokens = shlex.split(line, comments=True)
            if tokens:
                out.append(shlex.join(tokens))
    return out


def test_section_commands_parse_as_the_shell_reads_them():
    readme = ("\n## A\n\n```bash\nmake run    # a comment\n   # only a comment\n"
              "dvc exp show --keep 'a|b#c'   # kept: quoted\nX=1 dvc queue start -j 2\n```\n## B\n"
              "```bash\nnot this\n```\n")
    assert section_commands("A", readme) == ["make run", "dvc exp show --keep 'a|b#c'",
                                             "X=1 dvc queue start -j 2"]


def test_every_make_target_the_readme_names_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), flags=re.M))
    named = set(re.findall(r"`make ([a-z-]+)", README.read_text()))
    named |= {c.split()[1] for c in section_commands("Quick start")}
    assert named and named <= targets, named - targets


@pytest.fixture(scope="module")
def tour(tmp_path_factory) -> tuple[Path, dict]:
    """A fresh repository as a newcomer clones it, the test's environment as its ``.venv``, after
    the quick start's ``make run``."""
    dst = tmp_path_factory.mktemp("tour")
    env = {**copy_repo(dst), "FEDPIPE_THREADS": "1", "COLUMNS": "120"}
    env.pop("MLFLOW_TRACKING_URI", None)  # the project's own mlflow.db
    shrink_diffusion_track(dst)
    (dst / ".venv").symlink_to(BIN.parent)
    commit_all(dst, env)
    quick = section_commands("Quick start")
    assert quick == ["make run", "make test"]
    # the install step (.venv/.installed) counts as done: -o keeps make from remaking it
    sh(["make", "-o", ".venv/.installed", "run"], dst, env)
    assert (dst / "data/report/report.md").is_file()
    # as the README says of a run that changes the summary metrics: committed with dvc.lock
    status = sh(["git", "status", "--porcelain"], dst, env).stdout
    assert "data/evaluate/metrics.json" in status and "data/report/claims.json" in status, status
    commit_all(dst, env, "make run")
    return dst, env


def wait_for_queue(dst: Path, env: dict, timeout: float = 1800) -> str:
    t0 = time.time()
    while time.time() - t0 < timeout:
        status = sh(["dvc", "queue", "status"], dst, env).stdout
        if "Running" not in status and "Queued" not in status:
            return status
        time.sleep(5)
    pytest.fail(f"queue did not finish:\n{status}")


@pytest.mark.slow
def test_running_experiments_block_runs_as_written(tour):
    dst, env = tour
    commands = section_commands("Running experiments")
    assert any(c.startswith("dvc exp run --queue") for c in commands)
    name = None
    for cmd in commands:
        if cmd == "dvc queue status":
            status = wait_for_queue(dst, env)
            assert "Failed" not in status, status
            name = re.findall(r"^\S+\s+(\S+)\s", status, flags=re.M)[-1]
            continue
        if "<name>" in cmd:
            assert name, "the README applies an experiment before queueing any"
            cmd = cmd.replace("<name>", name)
        proc = sh(["bash", "-c", cmd], dst, env, check=False)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        if cmd.startswith("dvc exp show"):  # the recipe: 120 columns, main's metrics shown
            lines = proc.stdout.splitlines()
            assert max(len(line) for line in lines) <= 120, proc.stdout
            main = next(line for line in lines if re.search(r"\bmain\b|\bmaster\b", line))
            assert re.search(r"\d\.\d{3}", main) and "!" not in main, proc.stdout
