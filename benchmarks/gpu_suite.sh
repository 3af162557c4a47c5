#!/usr/bin/env bash
# The one GPU call: environment facts, `pytest -m gpu`, then every benchmark,
# with a short table last. Run from the repository root on a CUDA machine:
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
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
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

run pytest_gpu 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/
for bench in bench_ig bench_soft_margin; do
    [ -f "benchmarks/$bench.py" ] && run "$bench" 240 python3 "benchmarks/$bench.py" $QUICK --output "$OUT/$bench.md"
done
[ -f benchmarks/bench_callback_overhead.py ] && run bench_callback_overhead 240 \
    python3 benchmarks/bench_callback_overhead.py --accelerator gpu $QUICK --output "$OUT/bench_callback_overhead.md"

echo
echo "================ summary ================"
cat "$OUT/environment.txt"
grep -E "^(=+ )?[0-9]+ (passed|failed)|passed|failed" "$OUT/pytest_gpu.log" | tail -1
for table in "$OUT"/bench_*.md; do [ -f "$table" ] && { echo; cat "$table"; }; done
