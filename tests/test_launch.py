"""The warm-start launcher (`python -m fedpipe.launch script.py`): a forked stage behaves as a plain
`python script.py` would (argv, cwd, environment, output, exit code, signals, results), and a stage
never outlives the command that launched it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from fedpipe import launch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """A private socket folder (a server of this module's own) that exits soon after the tests."""
    tmp = tmp_path_factory.mktemp("launcher")
    out = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO / "src"),
           launch.IDLE_ENV: "60", "FEDPIPE_TRACKING": "off"}
    out.pop(launch.ENV, None)
    out.pop("FEDPIPE_THREADS", None)
    return out


def write(folder: Path, body: str) -> Path:
    script = folder / "stage.py"
    script.write_text(textwrap.dedent(body))
    return script


def run(script: Path, *args: str, env: dict[str, str], warm: bool = True,
        **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "fedpipe.launch"] if warm else [sys.executable]
    return subprocess.run([*cmd, str(script), *args], cwd=script.parent, env=env, text=True,
                          capture_output=True, timeout=300, **kw)


def sockets(env: dict[str, str]) -> list[Path]:
    return sorted(Path(env["TMPDIR"]).glob("fedpipe-*/*.sock"))


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_forked_stage_runs_as_a_plain_process_would(tmp_path, env):
    script = write(tmp_path, """
        import os, sys
        print("fedpipe modules at start:", sorted(m for m in sys.modules if m.startswith("fedpipe")))
        print("argv", sys.argv[1:], "cwd", os.getcwd(), "var", os.environ.get("STAGE_VAR"))
        print("path0", sys.path[0], "main", __name__)
        print("to stderr", file=sys.stderr)
        sys.exit(int(sys.argv[1]))
    """)
    plain = run(script, "3", "x y", env={**env, "STAGE_VAR": "a"}, warm=False)
    warm = run(script, "3", "x y", env={**env, "STAGE_VAR": "a"})
    assert sockets(env), "no server was started"
    again = run(script, "5", env={**env, "STAGE_VAR": "b"})  # the same server, other env/args
    assert warm.returncode == plain.returncode == 3
    assert warm.stdout == plain.stdout and warm.stderr == plain.stderr == "to stderr\n"
    assert "fedpipe modules at start: []" in warm.stdout  # the server never imports fedpipe
    assert f"path0 {tmp_path} main __main__" in warm.stdout
    assert again.returncode == 5 and "argv ['5']" in again.stdout and "var b" in again.stdout


@pytest.mark.skipif(not Path("/proc/self/comm").exists(), reason="process names are Linux's /proc")
def test_a_forked_stage_is_named_after_its_script(tmp_path, env):
    script = tmp_path / "federate.py"
    script.write_text("print(open('/proc/self/comm').read().strip())\n")
    proc = run(script, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "federate"


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(tmp_path, env):
    script = write(tmp_path, "raise ValueError('boom')\n")
    proc = run(script, env=env)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and proc.stderr.strip().endswith("ValueError: boom")


def test_results_are_bit_identical_to_a_plain_process(tmp_path, env):
    script = write(tmp_path, """
        import hashlib, torch
        g = torch.Generator().manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                    torch.nn.Linear(8 * 14 * 14, 10))
        for p in model.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.1
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(64, 1, 16, 16, generator=g), torch.randint(0, 10, (64,), generator=g)
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        print(torch.get_num_threads(), hashlib.md5(flat.numpy().tobytes()).hexdigest())
    """)
    plain, warm = run(script, env=env, warm=False), run(script, env=env)
    assert plain.returncode == warm.returncode == 0, warm.stderr
    assert warm.stdout == plain.stdout


def test_ctrl_c_reaches_the_stage_which_exits_130(tmp_path, env):
    script = write(tmp_path, """
        import time
        from fedpipe.cli import keep_on_interrupt, run_stage

        def main():
            keep_on_interrupt("checkpoint kept in data/checkpoints/x")
            print("ready", flush=True)
            time.sleep(60)

        run_stage(main)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "fedpipe.launch", str(script)], cwd=tmp_path,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines() == [
        "interrupted: checkpoint kept in data/checkpoints/x; run `dvc repro` to resume"]


def test_a_killed_launching_command_takes_its_stage_with_it(tmp_path, env):
    script = write(tmp_path, """
        import os, time
        open("pid", "w").write(str(os.getpid()))
        print("ready", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "fedpipe.launch", str(script)], cwd=tmp_path,
                            env=env, text=True, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "ready"
    stage = int((tmp_path / "pid").read_text())
    assert stage != proc.pid
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(stage, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail("the stage process outlived the killed launching command")


def test_a_stage_killed_by_sigkill_ends_the_launching_command_with_137(tmp_path, env):
    """The OOM killer's signal: the launching command dies of it too (a shell sees 137), with no
    traceback of its own."""
    script = write(tmp_path, """
        import os, time
        open("pid", "w").write(str(os.getpid()))
        print("ready", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "fedpipe.launch", str(script)], cwd=tmp_path,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "ready"
    stage = int((tmp_path / "pid").read_text())
    assert stage != proc.pid  # the forked stage, not the launching command
    os.kill(stage, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err  # -9 from Popen: 137 in a shell
    assert err == ""


def test_off_runs_a_plain_process_and_starts_no_server(tmp_path, env):
    off = {**env, launch.ENV: "off", "TMPDIR": str(tmp_path)}
    script = write(tmp_path, "import os, sys; print(os.getpid()); sys.exit(4)\n")
    proc = subprocess.Popen([sys.executable, "-m", "fedpipe.launch", str(script)], cwd=tmp_path,
                            env=off, text=True, stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 4 and int(out) == proc.pid  # the launching process became the script
    assert not sockets(off)


def test_a_server_retires_when_packages_change(tmp_path, env):
    """After an install the server must not fork stages with the old imports: the stage runs as a
    plain process, and the next one starts a new server."""
    script = write(tmp_path, "import os; print(os.getppid())\n")
    first = run(script, env=env)
    assert first.returncode == 0 and sockets(env)
    assert int(first.stdout) != os.getpid()  # forked by the server's supervisor
    # the server compares its stamp with the folders' times: make its site-packages look changed
    site = next(p for p in sys.path if p.endswith("site-packages"))
    before = os.stat(site).st_mtime_ns
    try:
        os.utime(site, ns=(before + 10**9, before + 10**9))
        retired = run(script, env=env)
    finally:
        os.utime(site, ns=(before, before))
    assert retired.returncode == 0 and int(retired.stdout) == os.getpid()  # a plain process
    deadline = time.monotonic() + 20
    while sockets(env) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sockets(env), "the retired server still listens"


def test_server_key_depends_on_what_shapes_imports(tmp_path):
    base = {"PYTHONPATH": "src", "OMP_NUM_THREADS": ""}
    assert launch.server_key(base, "/a") == launch.server_key(dict(base), "/a")
    assert launch.server_key(base, "/a") != launch.server_key(base, "/b")  # relative: resolved
    assert launch.server_key(base, "/a") != launch.server_key({**base, "OMP_NUM_THREADS": "1"}, "/a")
    assert launch.server_key({"PYTHONPATH": "/abs"}, "/a") == launch.server_key({"PYTHONPATH": "/abs"},
                                                                               "/b")


def test_usage_line_without_a_script(env):
    proc = subprocess.run([sys.executable, "-m", "fedpipe.launch"], env=env, text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: python -m fedpipe.launch")


def test_stop_ends_the_servers(tmp_path, env):
    # a short folder of its own: a Unix socket's path has at most 107 bytes, and pytest's tmp_path
    # under a long TMPDIR can exceed it (the launcher then runs the stage as a plain process)
    short = Path(tempfile.mkdtemp(prefix="fp-", dir="/tmp"))
    own = {**env, "TMPDIR": str(short)}
    assert run(write(tmp_path, "print(1)\n"), env=own).returncode == 0
    assert sockets(own)
    proc = subprocess.run([sys.executable, "-m", "fedpipe.launch", "--stop"], env=own, text=True,
                          capture_output=True, timeout=60)
    assert proc.stdout.strip() == "stopped 1 launcher server(s)"
    deadline = time.monotonic() + 20
    while sockets(own) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sockets(own)
    shutil.rmtree(short, ignore_errors=True)


def test_a_bad_idle_setting_is_one_line_and_exit_2(tmp_path, env):
    script = write(tmp_path, "open('ran', 'w').close()\n")
    proc = run(script, env={**env, launch.IDLE_ENV: "soon"})
    assert proc.returncode == 2 and not (tmp_path / "ran").exists()
    assert proc.stderr.strip().splitlines() == [
        "error: invalid config: FEDPIPE_LAUNCHER_IDLE='soon'; allowed: a number of seconds > 0"]
    assert launch.idle_seconds({}) == launch.DEFAULT_IDLE
    assert launch.idle_seconds({launch.IDLE_ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "inf", "nan"):
        with pytest.raises(ValueError):
            launch.idle_seconds({launch.IDLE_ENV: bad})


def test_without_a_socket_folder_the_stage_runs_as_a_plain_process(tmp_path, env):
    blocked = tmp_path / "tmp"
    blocked.mkdir()
    (blocked / f"fedpipe-{os.getuid()}").write_text("a file where the socket folder would be")
    script = write(tmp_path, "import os; print(os.getppid())\n")
    t0 = time.monotonic()
    proc = run(script, env={**env, "TMPDIR": str(blocked)})
    assert proc.returncode == 0 and int(proc.stdout) == os.getpid()  # exec'd in place, no server
    assert time.monotonic() - t0 < 30
