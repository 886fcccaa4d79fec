"""docs/extending.md's method example, built and run as the guide says, so that the guide stays true.

In a copy of the repository: the method's file and its unit test are taken from the guide's code
blocks (marked ``<!-- extending: <path> -->``), the guide's commands (``<!-- extending: run -->``)
run through DVC on the guide's classification study with fewer rounds, and the run must leave what
the guide says: the method registered and run, its code file naming its module and no other
method's, and ``git status`` showing the one new file and the experiment's params, lock and metrics.
"""

import json
import re
import shlex

import pytest
from repo_copy import BIN, REPO, commit_all, copy_repo, sh

pytestmark = pytest.mark.slow

GUIDE = REPO / "docs" / "extending.md"
METHOD_FILE = "src/fedpipe/algorithms/fedavg_clip.py"
TEST_FILE = "tests/test_fedavg_clip.py"
TINY = ["-S", "fl.rounds=2", "-S", "fl.local.epochs=1"]  # appended to the guide's `dvc exp run`
# what the guide says the run modifies, besides the new file
CHANGED = {"params.yaml", "dvc.lock", "data/evaluate/metrics.json", "data/report/metrics.json",
           "data/report/claims.json"}


def block(marker: str) -> str:
    """The code block that follows ``<!-- extending: <marker> -->`` in the guide."""
    found = re.search(rf"<!-- extending: {re.escape(marker)} -->\n```\w*\n(.*?)\n```\n",
                      GUIDE.read_text(), re.S)
    assert found, f"docs/extending.md has no code block marked {marker!r}"
    return found.group(1) + "\n"


def commands(text: str) -> list[list[str]]:
    """The command lines of a shell block (continued lines joined), as argument lists."""
    lines = text.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_guide_blocks_are_found():
    assert "@register(\"fedavg_clip\")" in block(METHOD_FILE)
    assert [c[:3] for c in commands(block("run"))][-1] == ["dvc", "exp", "run"]
    assert commands("a b \\\n  c\n# no\n\nd 'e f'\n") == [["a", "b", "c"], ["d", "e f"]]


def test_the_guides_method_runs_through_dvc_from_one_new_file(tmp_path):
    dst = tmp_path / "repo"
    dst.mkdir()
    # the copy's package runs (not the checkout's), tracking off: nothing here reads MLflow
    env = {**copy_repo(dst), "PYTHONPATH": str(dst / "src"), "FEDPIPE_TRACKING": "off"}
    commit_all(dst, env)

    (dst / METHOD_FILE).write_text(block(METHOD_FILE))
    for argv in commands(block("run")):
        sh([*argv, *TINY] if argv[:3] == ["dvc", "exp", "run"] else argv, dst, env)

    metrics = json.loads((dst / "data/federate/fedavg_clip/seed_0/metrics.json").read_text())
    assert metrics["rounds"] == 2
    code = json.loads((dst / "data/plan/stages/federate/fedavg_clip.json").read_text())["code"]
    assert "fedpipe/algorithms/fedavg_clip.py" in code
    methods = {f"fedpipe/algorithms/{p.name}" for p in (dst / "src/fedpipe/algorithms").glob("*.py")
               if p.stem not in ("__init__", "__main__", "registry", "fedavg_clip")}
    assert methods and not methods & set(code), sorted(methods & set(code))

    status = sh(["git", "status", "--porcelain", "--untracked-files=all"], dst, env).stdout
    entries = {line[3:]: line[:2] for line in status.splitlines()}
    assert {p for p, s in entries.items() if s in ("??", "A ")} == {METHOD_FILE}, status
    assert {p for p, s in entries.items() if s not in ("??", "A ")} == CHANGED, status
    guide = GUIDE.read_text()
    assert all(f"`{p}`" in guide for p in CHANGED)

    probe = ("import sys\n"
             "from fedpipe.algorithms import ALGORITHMS\n"
             "from fedpipe.fl.strategy import batches\n"
             "cls = ALGORITHMS['fedavg_clip']\n"
             "print(sys.modules[cls.__module__].__file__, cls.config_class().max_norm, batches(cls),"
             " 'fedavg_clip' in ALGORITHMS)\n")
    out = sh([str(BIN / "python"), "-c", probe], dst, env).stdout.split()
    assert out == [str(dst / METHOD_FILE), "1.0", "True", "True"], out

    # the guide's unit test of the new step passes against the guide's file
    (dst / TEST_FILE).write_text(block(TEST_FILE))
    sh([str(BIN / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST_FILE], dst, env)
