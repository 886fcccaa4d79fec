"""DVC stage `evaluate`: global and per-client accuracy of every algorithm of the study, plots and a
comparison table. Reads params: seed, dataset, model, fl, study, algorithms; the partition and
data/federate/."""

from fedpipe.cli import run_stage
from fedpipe.config import load_params
from fedpipe.pipeline.common import train_config
from fedpipe.pipeline.evaluate import evaluate_study
from fedpipe.tracking import stage_run


def main() -> None:
    params = load_params()
    first = train_config(params, ((params.get("study") or {}).get("algorithms") or ["fedavg"])[0])
    names = first.study.algorithms[1:] + first.study.calibrated_algorithms
    cfgs = [first] + [train_config(params, a) for a in names]
    with stage_run("evaluate", {"study": params.get("study"), **first.params_read}, first.seed) as run:
        out = evaluate_study(cfgs)
        for algo, m in out.metrics.items():
            run.log_metrics({f"{algo}.{k}": v for k, v in m.items()})
        for p in out.plots:
            run.log_artifact(p, "plots")
    print(out.table)


if __name__ == "__main__":
    run_stage(main)
