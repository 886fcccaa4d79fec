"""DVC stage `evaluate`: generic and personalized accuracy of every algorithm and replicate of the
study (each run on its replicate's partition), mean ± std over replicates, plots and a comparison
table. Reads params: seed (the shared corrupted test sets), dataset, model, study; every replicate's
partition (data/partition/seed_<seed>/) and data/federate/."""

from fedpipe.cli import run_stage
from fedpipe.config import load_params
from fedpipe.pipeline.common import train_config
from fedpipe.pipeline.evaluate import evaluate_study
from fedpipe.tracking import stage_run


def main() -> None:
    params = load_params()
    first = train_config(params, ((params.get("study") or {}).get("algorithms") or ["fedavg"])[0])
    cfgs = [train_config(params, a, s) for a in first.study.algorithms for s in first.study.seeds]
    read = {k: v for k, v in first.params_read.items() if k not in ("device", "accel")}  # CPU here
    with stage_run("evaluate", {"study": params.get("study"), **read}, first.seed) as run:
        out = evaluate_study(cfgs)
        for algo, m in out.metrics.items():
            run.log_metrics({f"{algo}.{k}": v for k, v in m.items()})
        for p in out.plots:
            run.log_artifact(p, "plots")
    print(out.table)


if __name__ == "__main__":
    run_stage(main)
