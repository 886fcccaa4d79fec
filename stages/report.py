"""DVC stage `report`: one markdown report for the study (diffusion-track FID with mean +- std over
seeds and the paper's numbers beside ours; classification-track accuracy, mean +- std over seeds) and
the claims table (each paper's headline claims judged over the training seeds), the FID curves.

Reads params: seed, dataset, partition, study, algorithms (for PerAda's Table 1 rows);
data/federate_ddpm/<algorithm>/seed_<seed>/,
data/evaluate/metrics.json and data/evaluate/seeds.json.
Writes data/report/ (report.md, claims.md, fid_curves.png, metrics.json, claims.json); logs the
summaries, each claim's verdict (claims/<key>/held, mean_diff, se, p_holm) and the files to MLflow,
and the claims table (claims.md), the claim counts (claims.held, ...) and the FINISHED status to the
study's parent run (artifact claims/claims.md). Then replays every spooled run of the study into
MLflow (fedpipe.tracking.sync): stages spool their runs and never import MLflow themselves.
"""

from fedpipe.claims import summary as claims_summary
from fedpipe.cli import run_stage
from fedpipe.config import dataset_config, load_params
from fedpipe.config.core import build, check_sections, read_seed
from fedpipe.config.dataset import is_stand_in
from fedpipe.config.fl import StudyConfig
from fedpipe.config.partition import partition_config
from fedpipe.pipeline.report import REPORT_DIR, build_report
from fedpipe.tracking import stage_run
from fedpipe.tracking.sync import sync_pending


def main() -> None:
    params = load_params()
    check_sections(params)  # validates before reading anything
    seed = read_seed(params)
    dataset = dataset_config(params.get("dataset"))
    partition = partition_config(params.get("partition"))
    study = build(StudyConfig, params.get("study"), "study")
    title = f"{dataset.name}, {partition.scheme}, {partition.num_clients} clients"
    read = {k: params.get(k) for k in ("seed", "dataset", "partition", "study", "algorithms")}
    with stage_run("report", read, seed) as run:
        out = build_report(study, title, algorithms=params.get("algorithms"),
                           stand_in=is_stand_in(params))
        for algo, s in out.summary.items():
            run.log_metrics({f"{algo}.{k}": v for k, v in s.items()})
        for r in out.claims:
            run.log_metrics({f"claims/{r.claim.key}/{k}": v for k, v in
                             (("held", float(r.held)), ("mean_diff", r.mean_diff), ("se", r.se),
                              ("p_holm", r.p_holm))
                             if v is not None})
        for p in out.plots:
            run.log_artifact(p, "report")
        run.log_parent_artifact(REPORT_DIR / "claims.md", "claims")  # the study's claims table
        run.log_parent_metrics({f"claims.{k}": v for k, v in claims_summary(out.claims).items()})
        run.finish_parent()  # the last stage: the pipeline execution ended well
    sync_pending()  # the study's spooled runs into MLflow: the one process of a study that imports it
    print(out.text)


if __name__ == "__main__":
    run_stage(main)
