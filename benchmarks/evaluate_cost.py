"""The evaluate stage's cost per run: :func:`fedpipe.pipeline.evaluate.evaluate_run` against the
per-model computation it replaced (``reference_evaluate_run`` of ``tests/test_eval_passes.py``: a
fresh model per client in train mode, every set scored model by model, PM(V), PM(L) and the
Global-test accuracy each with its own pass), on the runs of a study already trained here, in one
process, the two interleaved so that machine noise hits both; CPU time of the process
(``time.process_time``), which a loaded machine inflates less than wall time. Every compared metric
must be equal (the script stops otherwise).

    dvc exp run -S study=perada_smoke -S 'study.seeds=[0]'   # the runs to score
    python benchmarks/evaluate_cost.py [--seed 0] [--repeats 3] [--threads 1]

Prints, per algorithm, the reference's and the stage's CPU seconds (median over repeats) and their
ratio, then the totals.

``--quick``: in a temporary directory, a tiny study trained first through the stages' functions
(digits, 4 IID clients, FedAvg and FedRep for one round, one corruption at severity 1), then scored
once: it checks that the benchmark runs and that the stage still matches the reference.

Measured on the shared 2-core CPU (load 3-6, niced, one thread, --repeats 3; perada_smoke replicate
0: 8 arms, 10 clients, 18 corrupted sets): perada 2.89 -> 2.63 s (x1.10), perada_nokd x1.08, fedrep
1.47 -> 0.22 s (x6.67: its personal models share the global body), fedavg_ft x1.08, ditto x1.15,
lg_fedavg x1.14, fedavg and feddf x1.03-1.04; all runs 12.48 -> 10.23 s (x1.22). Every metric equal.
At two threads on that loaded machine both took over ten times the CPU (threads spinning while the
other waits for a core), so compare at one thread there.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the reference lives beside the test that checks it

from test_eval_passes import reference_evaluate_run  # noqa: E402

from fedpipe.config import load_params  # noqa: E402
from fedpipe.data import load_dataset  # noqa: E402
from fedpipe.data.corruptions import corrupted_test_sets  # noqa: E402
from fedpipe.errors import InputError  # noqa: E402
from fedpipe.metrics import train_class_counts  # noqa: E402
from fedpipe.pipeline.common import clients_of, load_partition, train_config  # noqa: E402
from fedpipe.pipeline.evaluate import evaluate_run  # noqa: E402
from fedpipe.pipeline.inputs import partition_file  # noqa: E402
from fedpipe.pipeline.outputs import run_dir  # noqa: E402
from fedpipe.tasks import ClassificationTask  # noqa: E402


def cpu_seconds(fn, *args) -> tuple[float, object]:
    t0 = time.process_time()
    out = fn(*args)
    return time.process_time() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="the replicate whose runs are scored")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny study trained in a temporary directory, scored once")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.seed, args.repeats = 0, 1
    with quick_study() if args.quick else contextlib.nullcontext():
        try:
            measure(args)
        except InputError as e:  # a stage output missing: its message names the stage to run
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None


QUICK_STUDY = {"study": {"algorithms": ["fedavg", "fedrep"], "seeds": [0],
                         "corruptions": ["gaussian_noise"], "severities": [1]},
               "model": {"name": "mlp", "kwargs": {"hidden": 32}}}


@contextlib.contextmanager
def quick_study():
    """A temporary working directory holding the runs of :data:`QUICK_STUDY`, replicate 0."""
    from _quick import note, tiny_workdir, write_partition

    from fedpipe.pipeline.federate import federate

    with tiny_workdir(QUICK_STUDY) as params:
        write_partition(params, 0)
        for algorithm in params["study"]["algorithms"]:
            federate(train_config(params, algorithm, 0), progress=False)
        note("a tiny study trained in a temporary directory: digits, 4 IID clients, "
             + " and ".join(params["study"]["algorithms"]) + " for 1 round, gaussian_noise at "
             "severity 1")
        yield


def measure(args) -> None:
    params = load_params()
    study = params["study"]
    ds = load_dataset(train_config(params, study["algorithms"][0], args.seed).dataset)
    part = load_partition(partition_file(args.seed), args.seed)
    local = clients_of(ds, part, "test")
    counts = train_class_counts([c.y for c in clients_of(ds, part)], ds.meta.num_classes)
    corrupted = corrupted_test_sets(ds, study["corruptions"], study["severities"],
                                    int(params.get("seed", 0)))
    task = ClassificationTask()
    total = {"reference": 0.0, "stage": 0.0}
    for algorithm in study["algorithms"]:
        cfg = train_config(params, algorithm, args.seed)
        run = run_dir("data/federate", algorithm, args.seed)
        times: dict[str, list[float]] = {"reference": [], "stage": []}
        inputs = (cfg, run, ds, local, task, counts, corrupted)
        for _ in range(args.repeats):
            t_ref, (ref, _, _) = cpu_seconds(reference_evaluate_run, *inputs)
            t_new, (new, _, _) = cpu_seconds(evaluate_run, *inputs)
            times["reference"].append(t_ref)
            times["stage"].append(t_new)
            differ = [k for k, v in ref.items() if new.get(k) != v and v == v]
            if differ:
                raise SystemExit(f"{algorithm}: metrics differ from the reference: {differ}")
        a, b = (statistics.median(times[k]) for k in ("reference", "stage"))
        total["reference"] += a
        total["stage"] += b
        print(f"{algorithm:>12}: reference {a:.3f} s, stage {b:.3f} s (CPU), ratio {a / b:.2f}")
    a, b = total["reference"], total["stage"]
    print(f"{'total':>12}: reference {a:.3f} s, stage {b:.3f} s (CPU), ratio {a / b:.2f} "
          f"({torch.get_num_threads()} thread(s))")


if __name__ == "__main__":
    main()
