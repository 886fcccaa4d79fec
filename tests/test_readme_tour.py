"""The README's command blocks, so that the README cannot drift from the project.

- The quick start's ``make run`` and the README's ``dvc exp show`` recipe run in
  tests/test_pipeline.py (its first two tests, on its one end-to-end copy: one pipeline run
  serves both). ``make test`` is this suite; every other make target the README names must exist.
- Every ``dvc exp run`` of the "Running experiments" block composes (DVC's own Hydra composition,
  with fedpipe's override check) into params that every stage it runs accepts, its dataset
  included; every stage it names exists; its ``dvc exp show`` regex compiles.
"""

from __future__ import annotations

import re
import shlex

import yaml
from repo_copy import REPO

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


def experiment_overrides(cmd: str) -> list[list[str]]:
    """The override lists of one ``dvc exp run`` line: one list, or one per value of a sweep
    (``-S 'key=a,b,c'`` with ``--queue``)."""
    tokens = shlex.split(cmd)
    sets = [tokens[i + 1] for i, t in enumerate(tokens) if t == "-S"]
    runs = [[]]
    for o in sets:
        key, _, value = o.partition("=")
        values = value.split(",") if "," in value and not value.startswith("[") else [value]
        runs = [r + [f"{key}={v}"] for r in runs for v in values]
    return runs


def test_experiment_overrides_expand_a_sweep():
    assert experiment_overrides("dvc exp run --queue -S a=1 -S 'b=0.1,0.5' -S 'c=[x,y]'") == [
        ["a=1", "b=0.1", "c=[x,y]"], ["a=1", "b=0.5", "c=[x,y]"]]


def test_every_experiment_command_composes_into_params_every_stage_accepts(tmp_path):
    from fedpipe.config.core import load_params
    from fedpipe.data import load_dataset
    from fedpipe.pipeline.common import train_config
    from fedpipe.pipeline.compose import compose_params
    from fedpipe.pipeline.partition import partition_stage_config

    commands = section_commands("Running experiments")
    runs = [o for c in commands if c.startswith("dvc exp run") for o in experiment_overrides(c)]
    assert len(runs) >= 10
    for overrides in runs:
        params = load_params(compose_params(REPO, overrides, output=str(tmp_path / "params.yaml")))
        part = partition_stage_config(params)
        for algo in params["study"]["algorithms"]:
            cfg = train_config(params, algo)
        load_dataset(cfg.dataset)  # an embedded dataset, or one under data/raw/: never missing
        assert part.partition.scheme == params["partition"]["scheme"], overrides
    stages = set(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
    for c in commands:
        if c.startswith("dvc repro "):
            assert c.split()[2].split("@")[0] in stages, c
        if c.startswith("dvc exp show"):
            re.compile(shlex.split(c)[shlex.split(c).index("--keep") + 1])
