"""What the size of a stage's dvc.lock entry costs: DVC loads and dumps the whole lock after every
stage it runs, so that cost is paid per stage and grows with the study (issue 43).

For each N of ``--stages``, a lock of N copies of one entry is serialised as DVC writes it, then loaded
and dumped with DVC's own YAML functions (``dvc.utils.serialize``: ``parse_yaml_for_update``,
``dumps_yaml``, the round-trip path of its lock file), median of ``--repeats``. Four entries:

- ``plain``: one dep and one out, what a plain DVC user's stage writes;
- ``fedpipe``: a ``federate@<method>-<seed>`` entry as this repository's ``dvc.lock`` holds it (its
  code and params are one file the plan writes, ``data/plan/stages``, and its outputs one folder);
- ``files apart``: the same entry with code, params and input files as three plan files and the run's
  six outputs listed one by one (two deps and five outs more, with this entry's hashes and sizes), as
  before that change;
- ``params listed``: that entry with its params listed in dvc.yaml too, as before the params file:
  DVC then copies every value of ``dataset``, ``model``, ``fl``, ``algorithms.<method>``, ``device``
  and ``accel`` (from this repository's ``params.yaml``) into the entry.

Prints lines and seconds per load+dump for each, and the ratios of ``files apart`` and ``params
listed`` to ``fedpipe`` at the largest N (``lock load+dump at N=<n>: params listed / fedpipe = x<r>``).

    python benchmarks/lock_size.py [--stages 10 100 300] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import yaml
from dvc.utils.serialize import dumps_yaml, parse_yaml_for_update

REPO = Path(__file__).resolve().parents[1]
STAGE_SECTIONS = ("dataset", "model", "fl", "device", "accel")

PLAIN = {"cmd": "python -c 'import shutil; shutil.copy(\"in_0\", \"out_0\")'",
         "deps": [{"path": "in_0", "hash": "md5", "md5": "0" * 32, "size": 10}],
         "outs": [{"path": "out_0", "hash": "md5", "md5": "0" * 32, "size": 10}]}


def entries() -> dict[str, dict]:
    """The four entries: plain, fedpipe's federate entry, that entry with its files apart, and that
    one with its params listed too."""
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    name, fed = next((k, v) for k, v in lock.items() if k.startswith("federate@"))
    method = name.split("@")[1].rsplit("-", 1)[0]
    apart = copy.deepcopy(fed)
    plan = next(d for d in apart["deps"] if d["path"].startswith("data/plan/stages/"))
    apart["deps"] = [d for d in apart["deps"] if d is not plan] + [
        dict(plan, path=f"data/plan/{kind}/{tail}") for kind, tail in
        (("code", f"federate/{method}.json"), ("params", f"federate/{method}.json"),
         ("inputs", f"{method}.json"))]
    run = apart["outs"][0]
    folder, md5 = run["path"], run["md5"].removesuffix(".dir")
    apart["outs"] = [{"path": f"{folder}/{f}", "hash": "md5", "md5": md5, "size": run["size"]}
                     for f in ("clients.csv", "curves.png", "history.csv", "metrics.json",
                               "model.safetensors")]
    apart["outs"].insert(4, {"path": f"{folder}/personal", "hash": "md5", "md5": f"{md5}.dir",
                             "size": 20, "nfiles": 1})
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    listed = copy.deepcopy(apart)
    values = {s: params.get(s) for s in STAGE_SECTIONS}
    values[f"algorithms.{method}"] = (params.get("algorithms") or {}).get(method, {})
    listed["params"] = {"params.yaml": values}
    return {"plain": PLAIN, "fedpipe": fed, "files apart": apart, "params listed": listed}


def load_dump_seconds(entry: dict, n: int, repeats: int) -> tuple[int, float]:
    """(lines, median seconds of one load+dump) of a lock holding ``n`` copies of ``entry``."""
    text = dumps_yaml({"schema": "2.0", "stages": {f"s@{i}": copy.deepcopy(entry) for i in range(n)}})
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        dumps_yaml(parse_yaml_for_update(text, "dvc.lock"))
        times.append(time.perf_counter() - t)
    return text.count("\n"), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[10, 100, 300])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="N = 3 and 10, one repeat")
    args = ap.parse_args()
    if any(n < 1 for n in args.stages) or args.repeats < 1:
        raise SystemExit("error: --stages takes N >= 1 and --repeats at least 1")
    if args.quick:
        args.stages, args.repeats = [3, 10], 1
    kinds = entries()
    print("lock of N copies of one entry, one load+dump with DVC's YAML (median of "
          f"{args.repeats}), seconds:")
    print(f"{'entry':>14s} {'N':>5s} {'lines':>7s} {'seconds':>8s}")
    result: dict[tuple[str, int], float] = {}
    for kind, entry in kinds.items():
        for n in args.stages:
            lines, sec = load_dump_seconds(entry, n, args.repeats)
            result[kind, n] = sec
            print(f"{kind:>14s} {n:5d} {lines:7d} {sec:8.3f}")
    n = max(args.stages)
    print(f"lock load+dump at N={n}: fedpipe / plain = x{result['fedpipe', n] / result['plain', n]:.2f}")
    print(f"lock load+dump at N={n}: files apart / fedpipe = "
          f"x{result['files apart', n] / result['fedpipe', n]:.2f}")
    print(f"lock load+dump at N={n}: params listed / fedpipe = "
          f"x{result['params listed', n] / result['fedpipe', n]:.2f}")


if __name__ == "__main__":
    main()
