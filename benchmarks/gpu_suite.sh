#!/usr/bin/env bash
# The one GPU call: environment facts, `pytest -m gpu`, then the benchmarks,
# with a short table last. (The examples' GPU runs are benchmarks/examples_gpu.sh.) Run from the repository root on a CUDA machine:
#   OUT=/some/dir [PART=a|b|all] [BENCH_RUNS=dir] bash benchmarks/gpu_suite.sh [--quick]
# Wheels of pure-Python packages missing there may be put in .whl/; they are installed to /tmp/site first.
# Captum (for the Captum rows of bench_ig and bench_callback_training) is the one the benchmarks need; its
# requirements (matplotlib, numpy, packaging, torch, tqdm) are on the lent H200s already. Fetch it here with:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl captum==0.9.0
# (gymnasium, minatar and jsonschema travel the same way for the tests and examples that use them.)
set -uo pipefail
python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' || {
    echo "gpu_suite.sh: python3's torch sees no CUDA device here; run it on a CUDA machine" >&2
    exit 2
}
QUICK=${1:-}
OUT=${OUT:-benchmarks/results}
SUITE_S=${SUITE_S:-570}  # the whole suite's seconds: a 10-minute call less the machine's start and the summary
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
    echo "== $name: exit ${PIPESTATUS[0]} after ${SECONDS} s of the suite"
}

# Two calls, each inside a 10-minute lease (PART=a, then PART=b right after, while the machine is warm; PART=all
# runs both in one go where the lease allows). a: the GPU tests, bench_ig, then bench_callback_training with what is
# left (at most 240 s). b: bench_trust (the accuracy figures against references, the trained agents in .bench_runs/
# or BENCH_RUNS), bench_checks, bench_callback_images, and the kernels' own benchmarks when the call has time.
PART=${PART:-all}
RUNS=${BENCH_RUNS:-.bench_runs}
if [ "$PART" = a ] || [ "$PART" = all ]; then
    run pytest_gpu 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/
    run bench_ig 80 python3 benchmarks/bench_ig.py $QUICK --output "$OUT/bench_ig.md"
    left=$(( SUITE_S - SECONDS ))
    budget=$(( left - 30 < 240 ? left - 30 : 240 ))  # 30 s for the benchmark to finish the block it is in
    if [ "$budget" -ge 60 ]; then
        run bench_callback_training "$left" python3 benchmarks/bench_callback_training.py $QUICK --budget-s "$budget" \
            --output "$OUT/bench_callback_training.md"
    else
        echo "== bench_callback_training: skipped, ${left} s left of the suite's ${SUITE_S} s" \
            | tee "$OUT/bench_callback_training.log"
    fi
fi
if [ "$PART" = b ] || [ "$PART" = all ]; then
    trust_mode=${QUICK:+--quick}
    run bench_trust 260 python3 benchmarks/bench_trust.py $trust_mode --device cuda --runs "$RUNS" \
        --output "$OUT/bench_trust.md"
    run bench_checks 120 python3 benchmarks/bench_checks.py --device cuda --runs "$RUNS" --output "$OUT/bench_checks.md"
    run bench_callback_images 110 python3 benchmarks/bench_callback_images.py --device cuda --runs 31 --completeness \
        --profile --output "$OUT/bench_callback_images.md"
    if [ $(( SUITE_S - SECONDS )) -ge 130 ]; then
        run bench_soft_margin 55 python3 benchmarks/bench_soft_margin.py $QUICK --dtypes float32 --time-budget 35 \
            --output "$OUT/bench_soft_margin.md"
    fi
fi

echo
echo "================ summary ================"
cat "$OUT/environment.txt"
[ -f "$OUT/pytest_gpu.log" ] && grep -E "^(=+ )?[0-9]+ (passed|failed)|passed|failed" "$OUT/pytest_gpu.log" | tail -1
for table in "$OUT"/bench_*.md; do [ -f "$table" ] && { echo; cat "$table"; }; done
# The logs travel as one archive (the lent machine returns at most 8 files).
tar -czf "$OUT/logs.tar.gz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
