"""DVC stage `federate_aux@<algorithm>`: a classification-track algorithm that calibrates the global
classifier on the labelled auxiliary set after each round (FedDDPM applied to classification; needs
`diffusion.conditional: true`). Listed in `study.calibrated_algorithms`.

Reads params: seed, dataset, model, fl, algorithms.<algorithm>; the partition and the auxiliary set.
Writes data/federate/<algorithm>/ like `federate@<algorithm>`, so `evaluate` compares it with the rest.
"""

from federate import main  # stages/federate.py (this directory is on sys.path when run as a script)

from fedpipe.cli import run_stage
from fedpipe.pipeline.diffusion import AUX_FILE

if __name__ == "__main__":
    run_stage(lambda: main("federate_aux", str(AUX_FILE)))
