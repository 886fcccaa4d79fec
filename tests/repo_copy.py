"""A git repository holding the project's tracked and untracked-but-not-ignored files, for the
end-to-end DVC tests (each works in its own copy)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def sh(cmd: list[str], cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def stages_ran(stdout: str) -> set[str]:
    """The stages a ``dvc repro`` / ``dvc exp run`` output says it ran."""
    return {ln.split("'")[1] for ln in stdout.splitlines() if ln.startswith("Running stage '")}


def repro(cwd: Path, env: dict) -> set[str]:
    """``dvc repro`` in ``cwd`` (the test's interpreter's DVC); the stages it ran."""
    return stages_ran(sh([str(BIN / "dvc"), "repro"], cwd, env).stdout)


def copy_repo(dst: Path) -> dict:
    """Copy the project into ``dst`` (not yet a git repo); return the environment to run DVC in."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "FEDPIPE_TRACKING": "on", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "DVC_NO_ANALYTICS": "1"}


def commit_all(dst: Path, env: dict, message: str = "copy") -> None:
    if not (dst / ".git").exists():
        sh(["git", "init", "-q"], dst, env)
    sh(["git", "add", "-A"], dst, env)
    sh(["git", "commit", "-qm", message, "--allow-empty"], dst, env)
