"""Warm start for stage scripts: ``python -m fedpipe.launch stages/<x>.py [args]``.

Every DVC stage is a new Python process, and on this project's small studies its start-up outweighs
its work: importing torch, MLflow (with its SQL store), matplotlib and, for the diffusion track,
diffusers takes about 5 s per stage on a 2-core machine, against well under a second for a federate
stage of a smoke study. The launcher removes that cost, as a fork server does (``multiprocessing``'s
forkserver, nailgun): a background server process imports those third-party libraries once and forks
a copy of itself for every stage; the copy runs the stage script exactly as ``python script`` would.
Written by hand: ``multiprocessing``'s forkserver runs functions of the parent program, not a script
with the caller's descriptors, environment and signals, and no maintained package does that.

What a forked stage gets from the launching command (so that it behaves as a cold start would):
argv, working directory, the whole environment, umask, CPU affinity, standard input/output/error
(the descriptors themselves, passed over the socket: progress bars see the same terminal or pipe),
``sys.path`` as a fresh interpreter there would have it, and SIGINT's disposition. fedpipe itself is
never imported by the server, so a stage always runs the code of its own working tree (a queued
``dvc exp`` runs in a temporary copy). Ctrl-C, SIGTERM and SIGHUP sent to the launching command are
passed on to the stage's process group; if the launching command is killed, the stage is killed
too. The launching command exits with the stage's exit code (or dies of the same signal).

Results are bit-identical to a cold start (tested): the server only imports modules, it runs no
torch operation, starts no thread and draws no random number before it forks.

The server listens on a Unix socket under ``$TMPDIR/fedpipe-<uid>/`` named by a key of the Python
interpreter and the settings that shape imports (``PYTHONPATH``, ``OMP_NUM_THREADS``,
``MKL_NUM_THREADS``), exits after ``FEDPIPE_LAUNCHER_IDLE`` seconds without a request (default 120),
and retires itself when a package is installed or removed (the site-packages folders changed). If it
cannot be reached or started, the script runs in a plain new process, as without the launcher.
``FEDPIPE_LAUNCHER=off`` always does that (e.g. to run a stage under a debugger or a profiler).
``python -m fedpipe.launch --stop`` stops this user's servers (the test suite does at its end).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENV = "FEDPIPE_LAUNCHER"  # "off": no server, every stage is a plain new process
IDLE_ENV = "FEDPIPE_LAUNCHER_IDLE"  # seconds a server waits for a request before it exits
DEFAULT_IDLE = 120.0
START_TIMEOUT = 120.0  # seconds a launching command waits for a new server's first imports

# imported before the server listens: what (nearly) every stage imports
PRELOAD = ("numpy", "torch", "safetensors.torch", "yaml", "tqdm", "tqdm.contrib.logging",
           "mlflow", "mlflow.store.tracking.sqlalchemy_store", "matplotlib", "matplotlib.pyplot")
# imported while the server waits for requests: what some stages import (the diffusion track,
# FID, datasets); a stage forked before they are loaded imports them itself
PRELOAD_LATER = ("torchvision", "torchmetrics", "diffusers", "scipy.linalg")
KEY_ENV = ("PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_HEADER = struct.Struct("!Q")


def enabled(env: dict[str, str] | os._Environ = os.environ) -> bool:
    return env.get(ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def idle_seconds(env: dict[str, str] | os._Environ = os.environ) -> float:
    """``FEDPIPE_LAUNCHER_IDLE``: seconds > 0 (default 120); anything else is a ValueError whose
    message is the one line the launching command prints."""
    raw = env.get(IDLE_ENV, "").strip()
    if not raw:
        return DEFAULT_IDLE
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"invalid config: {IDLE_ENV}={raw!r}; allowed: a number of seconds > 0")
    return value


def server_key(env: dict[str, str] | os._Environ = os.environ, cwd: str | None = None) -> str:
    """The interpreter and the settings fixed when a server imports its modules: stages that differ
    in any of them never share a server. Relative ``PYTHONPATH`` entries count as resolved."""
    cwd = cwd or os.getcwd()
    parts = [sys.executable, sys.prefix, str(len(os.sched_getaffinity(0)))]
    for name in KEY_ENV:
        value = env.get(name, "")
        if name == "PYTHONPATH":
            value = os.pathsep.join(os.path.abspath(os.path.join(cwd, p)) if p else p
                                    for p in value.split(os.pathsep))
        parts.append(f"{name}={value}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def socket_path(key: str) -> Path:
    folder = Path(tempfile.gettempdir()) / f"fedpipe-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / f"{key}.sock"


def packages_stamp() -> list[tuple[str, int]]:
    """The modification times of the interpreter's package folders: an install or a removal changes
    them, and a server that imported the old versions must not serve any more stages."""
    stamp = []
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")) and os.path.isdir(entry):
            stamp.append((entry, os.stat(entry).st_mtime_ns))
    return stamp


# ---------------------------------------------------------------- wire format


def _send_json(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    msg = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [msg], fds)
    else:
        sock.sendall(msg)


def _recv_exact(sock: socket.socket, n: int, first: bytes = b"") -> bytes:
    buf = bytearray(first)
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed mid-message")
        buf += chunk
    return bytes(buf)


def _recv_json(sock: socket.socket, maxfds: int = 0) -> tuple[Any, list[int]]:
    """One message (and the descriptors sent with it); reads no byte of the next message."""
    fds: list[int] = []
    if maxfds:
        first, fds, _, _ = socket.recv_fds(sock, _HEADER.size, maxfds)
    else:
        first = sock.recv(_HEADER.size)
    if not first:
        raise ConnectionError("connection closed")
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, first))
    return json.loads(_recv_exact(sock, size)), fds


# ---------------------------------------------------------------- the launching command


def request(script: str, args: list[str]) -> dict[str, Any]:
    """What a forked stage needs to run as this process would have run it."""
    umask = os.umask(0)
    os.umask(umask)
    cold_path = [os.path.dirname(os.path.abspath(script))] + sys.path[1:]  # as `python script`
    return {"argv": [script, *args], "cwd": os.getcwd(), "env": dict(os.environ), "umask": umask,
            "affinity": sorted(os.sched_getaffinity(0)), "path": cold_path,
            "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except OSError:
        sock.close()
        return None


def _start_server(path: Path) -> socket.socket | None:
    import subprocess

    log = path.with_suffix(".log")
    with open(log, "ab") as err:
        server = subprocess.Popen([sys.executable, "-m", "fedpipe.launch", "--serve", str(path)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                  start_new_session=True, close_fds=True)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        sock = _connect(path)
        if sock is not None:
            return sock
        if server.poll() is not None and not path.exists():  # it failed to start (see its log)
            return None
        time.sleep(0.05)
    return None


def _ensure_stdio() -> None:
    """Descriptors 0-2 open (on /dev/null where closed, e.g. CI without standard input): they are
    passed to the stage process."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _cold(script: str, args: list[str]) -> None:
    """Run the script in this process's place, as ``python script args`` would."""
    os.execv(sys.executable, [sys.executable, script, *args])


def launch(script: str, args: list[str]) -> int:
    """Run ``script`` in a process forked by the warm server (started if needed); return its exit
    code. Falls back to a plain new process when the launcher is off or no server can be had."""
    try:
        idle_seconds()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not enabled():
        _cold(script, args)
    try:
        path = socket_path(server_key())
        sock = _connect(path) or _start_server(path)
    except OSError:  # no socket folder to be had here: a plain process
        sock = None
    if sock is None:
        _cold(script, args)
    _ensure_stdio()
    with sock:
        try:
            _send_json(sock, request(script, args), [0, 1, 2])
            reply, _ = _recv_json(sock)
        except (OSError, ConnectionError):
            reply = {"stale": True}
        if reply.get("stale"):  # retired (packages changed) or gone: this once, a plain process
            _cold(script, args)
        pid = int(reply["pid"])

        def forward(signum: int, _frame: object) -> None:
            try:
                os.killpg(pid, signum)
            except ProcessLookupError:
                pass

        for sig in FORWARDED:
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, forward)
        try:
            done, _ = _recv_json(sock)
        except (OSError, ConnectionError):
            print("fedpipe.launch: the stage's server went away", file=sys.stderr)
            return 1
    if done.get("signal"):
        die_of(int(done["signal"]))
    return int(done.get("exit", 1))


def die_of(sig: int) -> None:
    """End this process by signal ``sig``, as the stage ended, so the caller sees the same status
    (137 for SIGKILL, the OOM killer's). SIGKILL needs no handler reset (and cannot have one: setting
    it is an OSError)."""
    if sig != signal.SIGKILL:
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)


# ---------------------------------------------------------------- the server


def serve(path: Path) -> dict[str, Any] | None:
    """Import the common libraries, then fork a stage process per request until idle. Returns the
    request in a forked stage process (which then runs it); returns None when the server is done."""
    server_pid = os.getpid()
    os.environ.setdefault("MPLBACKEND", "Agg")
    import importlib
    import threading

    for name in PRELOAD:
        importlib.import_module(name)
    later = list(PRELOAD_LATER)
    stamp = packages_stamp()
    idle = idle_seconds()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    listener.bind(str(tmp))
    listener.listen(64)
    os.replace(tmp, path)
    ours = os.stat(path).st_ino
    path.with_suffix(".pid").write_text(str(os.getpid()))
    signal.signal(signal.SIGTERM, _stop_serving)
    last = time.monotonic()
    try:
        while True:
            listener.settimeout(0.05 if later else max(0.05, idle - (time.monotonic() - last)))
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if later:
                    try:
                        importlib.import_module(later.pop(0))
                    except Exception:  # noqa: BLE001 - optional: the stage imports it itself
                        pass
                    continue
                if time.monotonic() - last >= idle:
                    return None
                continue
            last = time.monotonic()
            if packages_stamp() != stamp or threading.active_count() != 1:
                _send_json(conn, {"stale": True})  # the launching command runs it plainly
                conn.close()
                return None
            if os.fork() == 0:  # the supervisor of this request
                listener.close()
                for sig in (signal.SIGCHLD, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)
                req = _supervise(conn)
                if req is not None:
                    return req  # in the stage process
                os._exit(0)
            conn.close()
    finally:
        if os.getpid() == server_pid:  # not in a forked supervisor or stage
            listener.close()
            try:
                if os.stat(path).st_ino == ours:
                    path.unlink()
            except FileNotFoundError:
                pass


def _stop_serving(_signum: int, _frame: object) -> None:
    raise SystemExit(0)  # the server's `finally` removes its socket


def stop_servers() -> int:
    """Stop this user's servers (SIGTERM; stages already forked run on); return how many. The test
    suite calls it at its end, so that no server outlives a test run."""
    folder = Path(tempfile.gettempdir()) / f"fedpipe-{os.getuid()}"
    stopped = 0
    for pid_file in folder.glob("*.pid"):
        try:
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            pid_file.unlink(missing_ok=True)
            continue
        if b"fedpipe.launch" in cmdline and b"--serve" in cmdline:  # not a reused pid
            os.kill(pid, signal.SIGTERM)
            stopped += 1
        pid_file.unlink(missing_ok=True)
    return stopped


def _supervise(conn: socket.socket) -> dict[str, Any] | None:
    """In the supervisor: read the request, fork the stage process, report its pid and then its end;
    kill it if the launching command goes away. Returns the request in the stage process."""
    import select

    try:
        req, fds = _recv_json(conn, maxfds=3)
    except (OSError, ConnectionError):
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)  # its own process group: signals reach the workers it starts too
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        conn.close()
        return req
    try:
        os.setpgid(pid, pid)  # also here, so that no signal can reach it before it has its group
    except OSError:
        pass
    for fd in fds:
        os.close(fd)
    _send_json(conn, {"pid": pid})
    while True:
        ready, _, _ = select.select([conn], [], [], 0.1)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.WIFSIGNALED(status):
                _send_json(conn, {"signal": os.WTERMSIG(status)})
            else:
                _send_json(conn, {"exit": os.WEXITSTATUS(status)})
            return None
        if ready and not conn.recv(1):  # the launching command is gone: so is its stage
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return None


def run_request(req: dict[str, Any]) -> None:
    """In the stage process: become what ``python <script> <args>`` started there would be, run the
    script as ``__main__``, and exit as that process would."""
    import importlib
    import io
    import runpy

    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    os.umask(req["umask"])
    os.sched_setaffinity(0, req["affinity"])
    signal.signal(signal.SIGINT, signal.SIG_IGN if req["sigint_ignored"] else signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(open(0, "rb", closefd=False), encoding=sys.stdin.encoding)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = io.TextIOWrapper(open(fd, "wb", closefd=False), encoding=getattr(sys, name).encoding,
                                  errors="backslashreplace" if fd == 2 else "strict",
                                  line_buffering=fd == 2 or os.isatty(fd), write_through=unbuffered)
        setattr(sys, name, stream)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    for name in [m for m in sys.modules if m == "fedpipe" or m.startswith("fedpipe.")]:
        del sys.modules[name]  # the stage imports its own working tree's code
    sys.path[:] = req["path"]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    sys.argv = list(req["argv"])
    _name_process(Path(sys.argv[0]).stem)
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        code: int | str | None = 0
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        _exit(0, signal.SIGINT)  # as Python ends on an uncaught Ctrl-C: by the signal itself
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, exit code 1
        sys.excepthook(*sys.exc_info())
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    _exit(code or 0)


def _name_process(name: str) -> None:
    """Name the stage process after its script where ``top`` and ``ps -o comm`` look (Linux's
    ``PR_SET_NAME``, 15 bytes); its full command line stays the server's."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the name stays the server's
        pass


def _exit(code: int, sig: int | None = None) -> None:
    """End the stage process as the interpreter would (other threads joined, ``atexit`` functions
    run, output flushed) but without tearing down every module one by one: with torch, MLflow and
    diffusers loaded that teardown alone takes two seconds, and a process ends anyway."""
    import atexit
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
    except Exception:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if sig is not None:
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(code)


def main(argv: list[str]) -> int:
    if argv == ["--stop"]:
        print(f"stopped {stop_servers()} launcher server(s)")
        return 0
    if len(argv) >= 2 and argv[0] == "--serve":
        req = serve(Path(argv[1]))
        if req is None:
            return 0
        run_request(req)  # a stage process: ends in it
        return 0
    if not argv or not argv[0].endswith(".py"):
        print("usage: python -m fedpipe.launch <script>.py [args...]", file=sys.stderr)
        return 2
    return launch(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
