#!/usr/bin/env bash
# One GPU session's checks in one command (docs/device.md, "One script per GPU session"): on a lent
# GPU machine whose Python has torch but not all of fedpipe's dependencies, run from the repository
# root with the missing wheels in .whl/ (Python 3.12, manylinux) and the prepared inputs in .gpu/:
#   .gpu/params_mnist5k.yaml  the composed params of fedddpm_mnist5k's first replicate, FedAvg and
#                             FedDDPM arms, device=cuda (python -m fedpipe.pipeline.compose)
#   .gpu/order_mnist5k.txt    DVC's stage order for them (benchmarks/pipeline_stages.py --write-order)
# Writes everything under $OUT/gpu.tar.gz (logs, estimate JSONs, stage times, metrics) and
# $OUT/summary.txt. BUDGET: seconds the whole script may take (default 500); the lanes stop on time.
#
# Lanes, after the batched benchmark, which runs alone (its ratio is of two arms in one process):
#   tests     pytest tests/test_cuda.py (every method, the batched executor, the diffusion stages)
#   mnist5k   fedddpm_mnist5k's first replicate, FedAvg and FedDDPM arms, stage by stage, timed
#   est-a/b/c the paper presets' cost estimates (python -m fedpipe.estimate), each preset stopped
#             with Ctrl-C at its lane's deadline (the stages before it are still projected)
# All lanes share the one GPU and 16 cores: their times are upper bounds of a lone run's.
set -u
T0=$(date +%s)
BUDGET=${BUDGET:-500}
OUT=${OUT:-/tmp/gpu-out}
W=/tmp/gpu-work
mkdir -p "$OUT" "$W" && touch "$W/start"
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$W/summary.txt"; }

if [ -z "${NO_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >"$W/pip.log" 2>&1 || { say "pip install failed"; tail -5 "$W/pip.log"; }
  mkdir -p /tmp/site/bin && ln -sf "$(command -v python3)" /tmp/site/bin/python
fi
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH FEDPIPE_TRACKING=off PYTHONUNBUFFERED=1
say "commit $(git rev-parse --short HEAD 2>/dev/null || cat .gpu/commit.txt 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$W/summary.txt"
python3 -c "import torch, diffusers, dvc, hydra, mlxtend, fedpipe; print('torch', torch.__version__)" \
  2>&1 | tee -a "$W/summary.txt"

# 1. the batched executor alone on the GPU
say "batched benchmark"
timeout 120 python3 benchmarks/batched.py --device cuda --repeats 3 --profile "$W/batched_profile.txt" \
  >"$W/batched.log" 2>&1
say "batched rc=$? $(grep -E '^(speedup|diffusion track)' "$W/batched.log" | tr '\n' ' ')"

# 2. the lanes, in parallel, each stopping before the budget
DEADLINE=$(( T0 + BUDGET - 25 ))
until_deadline() { echo $(( DEADLINE - $(date +%s) )); }

( t=$(until_deadline); timeout -s INT "$t" python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_cuda.py \
    -rA >"$W/test_cuda.log" 2>&1; echo "rc=$?" >>"$W/test_cuda.log" ) &

( cp .gpu/params_mnist5k.yaml params.yaml  # this copy of the repository is the machine's own
  t=$(until_deadline); timeout -s INT "$t" python3 benchmarks/pipeline_stages.py \
    --order .gpu/order_mnist5k.txt --out "$W/mnist5k_times.json" >"$W/mnist5k.log" 2>&1
  echo "rc=$?" >>"$W/mnist5k.log" ) &

lane() {  # presets one after another, each stopped at the lane's deadline
  local name=$1; shift
  for p in "$@"; do
    local t; t=$(until_deadline)
    [ "$t" -gt 30 ] || { echo "$p: no time left" >>"$W/$name.log"; continue; }
    echo "== $p ($t s left)" >>"$W/$name.log"
    timeout -s INT -k 20 "$t" python3 -m fedpipe.estimate "$p" --json "$W/est_$p.json" \
      --scratch "$W/scratch_$p" --round-budget 20 >>"$W/$name.log" 2>&1
    echo "== $p rc=$?" >>"$W/$name.log"
  done
}
lane est-a fedddpm_cifar10 fedddpm_mnist fedddpm_cifar100 &
lane est-b fednh_cifar10 perada_cifar10 fednh_cifar100 &
lane est-c fedptr_cifar10 equitable_cifar10 fedptr_fmnist equitable_mnist fedptr_cifar100 equitable_cifar100 &
wait
say "lanes done"
tail -3 "$W/test_cuda.log" | tee -a "$W/summary.txt"
tail -3 "$W/mnist5k.log" | tee -a "$W/summary.txt"
grep -h "^== .* rc=" "$W"/est-*.log | tee -a "$W/summary.txt"

# 3. what comes back: text only (no models, no images)
for p in "$W"/scratch_*; do  # each stage's log and the metrics files of the slices
  [ -d "$p" ] || continue
  mkdir -p "$W/slices/$(basename "$p")"
  cp -r "$p/_logs" "$W/slices/$(basename "$p")/" 2>/dev/null
  cp "$p/_estimate.json" "$W/slices/$(basename "$p")/" 2>/dev/null
done
find data -name "*.json" -size -2M -newer "$W/start" 2>/dev/null | while read -r f; do
  mkdir -p "$W/mnist5k_out/$(dirname "$f")" && cp "$f" "$W/mnist5k_out/$f"
done
cp data/report/*.md "$W/mnist5k_out/" 2>/dev/null
tar -czf "$OUT/gpu.tar.gz" -C "$W" --exclude='scratch_*' . 2>/dev/null
cp "$W/summary.txt" "$OUT/summary.txt"
say "packed $(du -h "$OUT/gpu.tar.gz" | cut -f1)"
