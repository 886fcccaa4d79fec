"""Every fault one line, the remaining cases (issue "every fault one line"): each table's rows are
faults, each gives one line, a non-zero exit (or the safe value) and no traceback.

- :data:`COMPOSE`: ``python -m fedpipe.pipeline.compose`` with an override that cannot compose (an
  unknown key, a group option with no file, Hydra's own refusals): one ``error: ...`` line, exit 2,
  nothing written (fedpipe.pipeline.compose.composition_error).
- :data:`READ_ONLY`: a stage run by hand where a folder it writes is read-only (the data/ output
  folder, data/checkpoints, mlspool/): one line naming the folder and what to do, exit 2
  (fedpipe.cli.permission_message). Run as user ``nobody`` (root writes whatever the permissions
  say) with ``setpriv``.
- :data:`RAY_TEMP`: the local Ray instance's temp folder is one of the user's alone
  (fedpipe.fl.ray_executor.private_temp_dir); one slow test starts Ray and finds its session there.
- DVC's usage analytics are off in the committed ``.dvc/config``.
- :data:`ORPHANS`: ``kill -9`` of the DVC process that started a stage stops the stage within
  seconds with one line, through its Ctrl-C handling (fedpipe.cli.watch_dvc).
- :data:`BUSY`: params.yaml is not rewritten while another DVC process runs in the repository
  (fedpipe.pipeline.compose.workspace_busy).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fedpipe.errors import CompositionError
from fedpipe.pipeline.compose import compose_params, workspace_busy

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "PYTEST_"))}
    return {**base, "PYTHONPATH": str(REPO / "src"), "FEDPIPE_TRACKING": "off", **extra}


def one_error_line(stderr: str) -> str:
    """The one line of ``stderr`` (asserted: exactly one non-empty line, no traceback)."""
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


# -- 1. composition ------------------------------------------------------------------------------
COMPOSE: dict[str, tuple[str, str]] = {
    # name: (override, the line)
    "unknown key": ("fl.roudns=3", "invalid config: fl.roudns=3; allowed: a key of fl (did you mean "
                    "fl.rounds?)"),
    "misspelt group option": ("study=clasification", "invalid config: study=clasification; allowed: a "
                              "file of conf/study/ (did you mean classification?)"),
    "group option like none": ("partition=zzz", "invalid config: partition=zzz; allowed: a file of "
                               "conf/partition/: dirichlet, iid, label_blocks, pathological, shards"),
    "override syntax": ("fl.rounds=[", "invalid config: fl.rounds=[ is not a Hydra override "
                        "(key=value, group=option, +key=value, ~key): no viable alternative at "
                        "input '['"),
    "append to a key that exists": ("+fl.rounds=3", "invalid config: Could not append to config. An "
                                    "item is already at 'fl.rounds'."),
    "delete a key that does not exist": ("~fl.nokey", "invalid config: Could not delete from config. "
                                         "'fl.nokey' does not exist."),
}


@pytest.mark.parametrize("case", COMPOSE)
def test_a_composition_that_fails_is_one_line(case, tmp_path):
    override, line = COMPOSE[case]
    with pytest.raises(CompositionError) as e:
        compose_params(REPO, [override], output=str(tmp_path / "params.yaml"))
    assert str(e.value) == line
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file left


@pytest.fixture(scope="module")
def conf_copy(tmp_path_factory) -> Path:
    """conf/ and hydra_plugins/ alone: the command composes there, never into the repo."""
    root = tmp_path_factory.mktemp("compose")
    shutil.copytree(REPO / "conf", root / "conf")
    shutil.copytree(REPO / "hydra_plugins", root / "hydra_plugins",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.mark.parametrize("case", ["unknown key", "misspelt group option"])
def test_the_compose_command_prints_one_line_and_exits_2(case, conf_copy):
    override, line = COMPOSE[case]
    proc = subprocess.run([PY, "-m", "fedpipe.pipeline.compose", override], cwd=conf_copy, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc.stderr) == f"error: {line}"
    assert proc.stdout == "" and not (conf_copy / "params.yaml").exists()


# -- 2. read-only folders --------------------------------------------------------------------------
def as_nobody() -> list[str] | None:
    """The command prefix that runs a process as user nobody when this one is root; None where
    that cannot be done (no ``setpriv``)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"] if setpriv else None


CHECKPOINTING = textwrap.dedent("""
    import torch
    from torch import nn
    from fedpipe.cli import run_stage
    from fedpipe.config.fl import FLConfig, LocalTrainConfig
    from fedpipe.data import ClientData
    from fedpipe.fl import Strategy, run_federated
    from fedpipe.pipeline.inputs import checkpoint_dir
    from fedpipe.tasks import ClassificationTask

    def main():
        g = torch.Generator().manual_seed(0)
        clients = [ClientData(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g))
                   for _ in range(2)]
        local = LocalTrainConfig(epochs=1, batch_size=4, lr=0.1)
        strategy = Strategy(ClassificationTask(), lambda: nn.Linear(4, 2), local, num_clients=2)
        run_federated(strategy, nn.Linear(4, 2), clients,
                      FLConfig(rounds=1, participation=1.0, local=local), 0, progress=False,
                      checkpoint_dir=checkpoint_dir("data/federate", "fedavg", "seed_0"))

    run_stage(main)
""")
PLAN = [str(REPO / "stages" / "plan.py")]  # the plan stage, run by hand: writes data/plan/

READ_ONLY: dict[str, tuple[str, list[str], dict[str, str]]] = {
    # name: (the read-only folder, the command, its environment)
    "data output folder": ("data", PLAN, {}),
    "data/checkpoints": ("data/checkpoints", ["-c", CHECKPOINTING], {}),
    "mlspool": ("mlspool", PLAN, {"FEDPIPE_TRACKING": "on", "FEDPIPE_TRACKING_FOLLOW": "off"}),
}


@pytest.fixture
def open_dir():
    """A folder any user may write (pytest's own are root's alone), with the repository's
    params.yaml; removed after."""
    folder = Path(tempfile.mkdtemp(prefix="fedpipe-ro-"))
    folder.chmod(0o755)
    repo = folder / "repo"
    (repo / "data" / "checkpoints").mkdir(parents=True)
    (repo / "mlspool").mkdir()
    shutil.copy2(REPO / "params.yaml", repo / "params.yaml")
    for p in [repo, *repo.rglob("*")]:
        p.chmod(0o777 if p.is_dir() else 0o666)
    yield repo
    for p in [repo, *repo.rglob("*")]:
        if p.is_dir():
            p.chmod(0o777)
    shutil.rmtree(folder)


@pytest.mark.parametrize("case", READ_ONLY)
def test_a_read_only_folder_is_one_line_and_a_non_zero_exit(case, open_dir):
    folder, command, extra = READ_ONLY[case]
    prefix = as_nobody()
    if prefix is None:
        pytest.skip("running as root without setpriv: a read-only folder is writable to root")
    (open_dir / folder).chmod(0o555)
    proc = subprocess.run([*prefix, PY, *command], cwd=open_dir, capture_output=True, text=True,
                          timeout=300, env=env(HOME=str(open_dir), **extra,
                                               MLFLOW_TRACKING_URI=f"sqlite:///{open_dir}/mlflow.db"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_error_line(proc.stderr)
    assert line.startswith(f"error: cannot write in folder {folder} (permission denied); make it "
                           f"writable for this user (chmod -R u+w {folder}"), line
    assert ("FEDPIPE_TRACKING=off" in line) == (folder == "mlspool"), line


# -- 3. Ray's temp folder --------------------------------------------------------------------------
def fresh(base: Path) -> None:
    pass


def private(base: Path) -> None:
    (base / f"fedpipe-ray-{os.getuid()}").mkdir(mode=0o700)


def open_to_all(base: Path) -> None:
    (base / f"fedpipe-ray-{os.getuid()}").mkdir()
    (base / f"fedpipe-ray-{os.getuid()}").chmod(0o777)


def a_link(base: Path) -> None:
    (base / "elsewhere").mkdir(mode=0o700)
    (base / f"fedpipe-ray-{os.getuid()}").symlink_to(base / "elsewhere")


def another_users(base: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a folder of another user needs root")
    private(base)
    os.chown(base / f"fedpipe-ray-{os.getuid()}", 65534, 65534)


RAY_TEMP: dict[str, tuple[Callable[[Path], None], bool]] = {
    # name: (what is at <temp>/fedpipe-ray-<uid> before, whether it is used)
    "none yet": (fresh, True),
    "a private folder": (private, True),
    "a folder open to all": (open_to_all, False),
    "a link": (a_link, False),
    "another user's folder": (another_users, False),
}


@pytest.mark.parametrize("case", RAY_TEMP)
def test_the_local_ray_instance_gets_a_folder_of_this_user_alone(case, tmp_path, monkeypatch):
    from fedpipe.fl.ray_executor import private_temp_dir

    make, used = RAY_TEMP[case]
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    make(tmp_path)
    got = Path(private_temp_dir())
    assert got.name == "ray"
    assert (got.parent == tmp_path / f"fedpipe-ray-{os.getuid()}") == used, got
    st = os.lstat(got.parent)
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700 and not got.parent.is_symlink()


def test_ray_tmpdir_set_is_left_to_ray(monkeypatch):
    from fedpipe.fl.ray_executor import private_temp_dir

    monkeypatch.setenv("RAY_TMPDIR", "/somewhere")
    assert private_temp_dir() is None


@pytest.mark.slow  # starting a local Ray instance takes 15-60 s
def test_a_local_ray_instance_keeps_its_session_in_the_private_folder():
    code = textwrap.dedent("""
        import ray
        from fedpipe.config.fl import RayConfig
        from fedpipe.fl.ray_executor import connect
        connect(RayConfig(), 1)
        print(ray._private.worker.global_worker.node.get_session_dir_path())
        ray.shutdown()
    """)
    base = Path(tempfile.mkdtemp(prefix="fr-", dir="/tmp"))  # short: Ray's socket paths
    try:
        e = env(TMPDIR=str(base), FEDPIPE_WORKERS="1")
        e.pop("RAY_TMPDIR", None)
        proc = subprocess.run([PY, "-c", code], env=e, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stderr
        session = Path(proc.stdout.strip().splitlines()[-1])
        private = base / f"fedpipe-ray-{os.getuid()}"
        assert session.parent == private / "ray", session
        assert os.stat(private).st_mode & 0o777 == 0o700
        assert not (base / "ray").exists()  # Ray's default under $TMPDIR: not used
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- 4. DVC's usage analytics ----------------------------------------------------------------------
def test_dvc_analytics_are_off_in_the_committed_config(monkeypatch):
    from configobj import ConfigObj
    from dvc.analytics import is_enabled

    assert ConfigObj(str(REPO / ".dvc" / "config"))["core"]["analytics"] == "false"
    monkeypatch.delenv("DVC_TEST", raising=False)
    monkeypatch.delenv("DVC_NO_ANALYTICS", raising=False)
    monkeypatch.chdir(REPO)
    assert is_enabled() is False  # as DVC decides, from the repository's config


# -- 5. a stage whose DVC is gone ------------------------------------------------------------------
STAGE = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from fedpipe.cli import keep_on_interrupt, run_stage

    def main():
        keep_on_interrupt("checkpoint kept in data/checkpoints/x")
        Path(sys.argv[1]).write_text(str(os.getpid()))
        time.sleep(60)

    run_stage(main)
""")
REAPER = textwrap.dedent("""
    import ctypes, json, os, subprocess, sys
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    top = subprocess.Popen(json.loads(sys.argv[1]), cwd=sys.argv[2])
    print(top.pid, flush=True)
    codes = {}
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        codes[pid] = os.waitstatus_to_exitcode(status)
    print(json.dumps(codes), flush=True)
""")


def parent_python(tmp: Path, stage: list[str]) -> tuple[list[str], str]:
    """A Python process starts the stage (its parent dies: the stage is handed to a reaper)."""
    code = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(120)"
    return [PY, "-c", code, *stage], "federate@fedavg-0"


def dvc_through_a_shell(tmp: Path, stage: list[str]) -> tuple[list[str], str]:
    """A process named dvc starts the stage through a shell that stays (the stage's parent lives
    on: DVC is found among its ancestors)."""
    fake = tmp / "dvc"
    fake.write_text(f"#!{PY}\nimport subprocess, sys, time\n"
                    "subprocess.Popen(['/bin/sh', '-c', sys.argv[1] + '; exit $?'])\n"
                    "time.sleep(120)\n")
    fake.chmod(0o755)
    import shlex

    return [str(fake), shlex.join(stage)], "federate@fedavg-0"


def real_dvc_repro(tmp: Path, stage: list[str]) -> tuple[list[str], str]:
    """``dvc repro`` of a one-stage pipeline."""
    import shlex

    subprocess.run([str(Path(PY).parent / "dvc"), "init", "-q", "--no-scm"], cwd=tmp, check=True,
                   env=env(DVC_NO_ANALYTICS="1"))
    (tmp / "dvc.yaml").write_text(f"stages:\n  orphan:\n    cmd: {json.dumps(shlex.join(stage))}\n"
                                  "    always_changed: true\n")
    return [str(Path(PY).parent / "dvc"), "repro", "-q"], "orphan"


ORPHANS = {
    "parent killed": parent_python,
    "dvc killed, a shell in between": dvc_through_a_shell,
    "real dvc repro killed": pytest.param(real_dvc_repro, marks=pytest.mark.slow),
}


@pytest.mark.parametrize("top", ORPHANS.values(), ids=list(ORPHANS))
def test_a_stage_whose_dvc_is_killed_stops_within_seconds_with_one_line(top, tmp_path):
    from fedpipe.cli import DVC_POLL_S

    ready = tmp_path / "ready"
    (tmp_path / "stage.py").write_text(STAGE)
    command, stage = top(tmp_path, [PY, str(tmp_path / "stage.py"), str(ready)])
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:
        reaper = subprocess.Popen([PY, "-c", REAPER, json.dumps(command), str(tmp_path)],
                                  stdout=subprocess.PIPE, stderr=stderr, text=True,
                                  env=env(DVC_STAGE=stage, DVC_NO_ANALYTICS="1", SHELL="/bin/sh"))
    try:
        top_pid = int(reaper.stdout.readline())
        deadline = time.monotonic() + 120
        while not ready.exists() or not ready.read_text():
            assert time.monotonic() < deadline and reaper.poll() is None, err.read_text()
            time.sleep(0.2)
        os.kill(top_pid, signal.SIGKILL)
        killed = time.monotonic()
        out, _ = reaper.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        if reaper.poll() is None:
            reaper.kill()
    codes = json.loads(out.strip().splitlines()[-1])  # pid: exit code of each process reaped
    assert codes.pop(str(top_pid)) == -signal.SIGKILL
    assert set(codes.values()) == {130}, (codes, err.read_text())  # the stage (and its shell)
    assert took < 3 * DVC_POLL_S + 6, took
    line = one_error_line(err.read_text())
    assert line == (f"error: DVC, which started stage {stage}, is gone: stopping; checkpoint kept in "
                    "data/checkpoints/x; run `dvc repro` to resume")


# -- 6. two runs in one workspace ------------------------------------------------------------------
@pytest.fixture
def a_dvc_process(tmp_path):
    """A live process whose command is dvc (a sleeping script of that name); its pid."""
    fake = tmp_path / "bin" / "dvc"
    fake.parent.mkdir()
    fake.write_text(f"#!{PY}\nimport time\ntime.sleep(120)\n")
    fake.chmod(0o755)
    proc = subprocess.Popen([str(fake), "exp", "run", "-S", "fl.rounds=3"])
    deadline = time.monotonic() + 30
    while "dvc" not in Path(f"/proc/{proc.pid}/cmdline").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield proc.pid
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen([PY, "-c", "pass"])
    proc.wait()
    return proc.pid


def rwlock(pid: int) -> dict[str, str]:
    entry = {"pid": pid, "cmd": "dvc exp run -S fl.rounds=3"}
    return {".dvc/tmp/rwlock": json.dumps({"write": {"/r/data/plan": entry},
                                           "read": {"/r/params.yaml": [entry]}})}


def workspace_run(pid: int) -> dict[str, str]:
    return {".dvc/tmp/exps/run/workspace/workspace.json": json.dumps(
        {"pid": pid, "stdin": None, "stdout": None, "stderr": None, "returncode": None})}


BUSY: dict[str, tuple[Callable[[int], dict[str, str]], Callable[[int], int], bool]] = {
    # name: (DVC's run files, whose pid they name (from the live dvc process's), refused)
    "a stage of a running dvc holds its locks": (rwlock, lambda live: live, True),
    "a workspace experiment runs": (workspace_run, lambda live: live, True),
    "the locks of a dvc that is gone": (rwlock, lambda live: dead_pid(), False),
    "the locks name a process that is not dvc": (rwlock, lambda live: os.getppid(), False),
    "the locks are this process's own": (workspace_run, lambda live: os.getpid(), False),
}


@pytest.mark.parametrize("case", BUSY)
def test_params_yaml_is_not_rewritten_while_another_dvc_runs(case, tmp_path, a_dvc_process):
    files, whose, refused = BUSY[case]
    root = tmp_path / "repo"
    pid = whose(a_dvc_process)
    for rel, text in files(pid).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    line = workspace_busy(root)
    assert (line is not None) == refused, line
    if refused:
        assert f"another DVC process (PID {pid}: " in line and "dvc queue start" in line, line
        (root / "params.yaml").write_text("seed: 0\n")
        with pytest.raises(CompositionError, match="params.yaml not written"):
            compose_params(root, [])  # before any composition
        assert (root / "params.yaml").read_text() == "seed: 0\n"
