"""DVC stage `plan`: which stages the study uses (fedpipe.pipeline.plan); the diffusion-side stages
depend on data/plan/diffusion.json and skip themselves when the study does not use them.

Reads params: every section, the project's code and the files the study's algorithms name by path
(hashed; the stage is always_changed). Writes data/plan/diffusion.json, data/plan/backbone.json,
data/plan/server_data.json, data/federate_ddpm/plan.json and data/plan/stages/ (each stage's one
plan dep: the code it runs and the params it reads).
"""

from fedpipe.cli import run_stage
from fedpipe.config import load_params
from fedpipe.config.core import read_seed
from fedpipe.pipeline.plan import check_every_section, check_study, write_plan
from fedpipe.tracking import stage_run


def main() -> None:
    params = load_params()
    read = {"study": params.get("study"), "algorithms": params.get("algorithms")}
    with stage_run("plan", read, read_seed(params)) as run:
        check_every_section(params, check_study(params))  # every section, before any stage computes
        plan = write_plan(params)  # no data is loaded
        run.log_tags({"plan.diffusion": str(plan["diffusion"]).lower(),
                      "plan.backbone": str(bool(plan["backbone"])).lower()})
    print("diffusion side:", "used" if plan["diffusion"] else "skipped (not used by this study)")
    print("backbone stage:", f"used by {', '.join(plan['backbone'])}" if plan["backbone"]
          else "skipped (no algorithm with backbone: fedavg)")


if __name__ == "__main__":
    run_stage(main)
