#!/usr/bin/env bash
# The one GPU call: environment facts, `pytest -m gpu`, then the benchmarks,
# with a short table last. (The examples' GPU runs are benchmarks/examples_gpu.sh.) Run from the repository root on a CUDA machine:
#   OUT=/some/dir bash benchmarks/gpu_suite.sh [--quick]
# Wheels of pure-Python packages missing there (captum, gymnasium) may be put in
# .whl/; they are installed to /tmp/site first.
set -uo pipefail
QUICK=${1:-}
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH=".:${PYTHONPATH:-}"

{
    echo "commit: ${LIG_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"  # LIG_COMMIT: where the copy carries no current .git
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    python3 -c 'import sys, torch, cupy, lightning; print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda, "| cupy", cupy.__version__, "| lightning", lightning.__version__)'
    python3 -c 'import captum; print("captum", captum.__version__)' 2>/dev/null || echo "captum: not installed"
} 2>&1 | tee "$OUT/environment.txt"

run() {  # run NAME TIMEOUT CMD...: log to $OUT/NAME.log, keep going on failure
    local name=$1 limit=$2; shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]}"
}

# Time limits keep the whole call inside a 10-minute lease (about 9 minutes of work).
run pytest_gpu 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/
run bench_ig 90 python3 benchmarks/bench_ig.py $QUICK --output "$OUT/bench_ig.md"
run bench_callback_images 150 python3 benchmarks/bench_callback_images.py --device cuda --runs 41 --completeness --profile \
    --output "$OUT/bench_callback_images.md"
run bench_ensemble 80 python3 benchmarks/bench_ensemble.py $QUICK --output "$OUT/bench_ensemble.md"
run bench_soft_margin 70 python3 benchmarks/bench_soft_margin.py $QUICK --dtypes float32 --time-budget 40 \
    --output "$OUT/bench_soft_margin.md"

echo
echo "================ summary ================"
cat "$OUT/environment.txt"
grep -E "^(=+ )?[0-9]+ (passed|failed)|passed|failed" "$OUT/pytest_gpu.log" | tail -1
for table in "$OUT"/bench_*.md; do [ -f "$table" ] && { echo; cat "$table"; }; done
# The logs travel as one archive (the lent machine returns at most 8 files).
tar -czf "$OUT/logs.tar.gz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
