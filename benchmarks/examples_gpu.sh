#!/usr/bin/env bash
# The examples on a GPU, in one call (about 6 minutes on an H200, at most 9.5 by the time limits below):
#   (a) examples/dqn_minatar.py with its defaults on the GPU, seed 1: time, env steps/s, gradient steps/s,
#       eval return against a uniformly random policy's; the run folder goes to $OUT/runs;
#   (b) the IG callback's cost in the MinAtar example: with vs without, ABBA order, a shortened run
#       (benchmarks/bench_minatar_overhead.py);
#   (c) examples/dqn_cartpole.py on the GPU (--accelerator gpu) and on the CPU (its default), same seed,
#       same shortened run, to show why the example picks the CPU for its 18K-parameter network.
# Run from the repository root on a CUDA machine:
#   OUT=/some/dir bash benchmarks/examples_gpu.sh
# Wheels of pure-Python packages missing there (minatar, gymnasium) may be put in .whl/; they are
# installed to /tmp/site first (minatar needs only numpy at run time: --no-deps is enough).
set -uo pipefail
# A dry run on a CPU: ACCELERATOR=cpu MINATAR_STEPS=8000 OVERHEAD_STEPS=8000 WARM_UP_STEPS=6000 CARTPOLE_STEPS=1500 \
#   OUT=/tmp/x bash benchmarks/examples_gpu.sh
OUT=${OUT:-benchmarks/results}
ACCELERATOR=${ACCELERATOR:-gpu}
MINATAR_STEPS=${MINATAR_STEPS:+--total-timesteps $MINATAR_STEPS}  # empty: the example's default
OVERHEAD_STEPS=${OVERHEAD_STEPS:-48000}
CARTPOLE_STEPS=${CARTPOLE_STEPS:-8000}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH=".:${PYTHONPATH:-}"

{
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    python3 -c 'import sys, torch, lightning; print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda, "| lightning", lightning.__version__)'
    python3 -c 'import minatar, gymnasium; print("minatar ok | gymnasium", gymnasium.__version__)' 2>&1 | grep -v -i seaborn
} 2>&1 | tee "$OUT/environment.txt"

run() {  # run NAME TIMEOUT CMD...: log to $OUT/NAME.log with its wall time, keep going on failure
    local name=$1 limit=$2; shift 2
    echo "== $name: $*"
    local started=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local status=${PIPESTATUS[0]}
    echo "== $name: exit $status, $((SECONDS - started)) s" | tee -a "$OUT/$name.log"
}

# shellcheck disable=SC2086  # MINATAR_STEPS is empty or two words
run minatar_gpu 300 python3 examples/dqn_minatar.py --accelerator "$ACCELERATOR" --seed 1 --no-progress-bar \
    --runs-dir "$OUT/runs" $MINATAR_STEPS
run minatar_overhead 110 python3 benchmarks/bench_minatar_overhead.py --accelerator "$ACCELERATOR" \
    --total-timesteps "$OVERHEAD_STEPS" --pairs 1 ${WARM_UP_STEPS:+--warm-up-timesteps $WARM_UP_STEPS} \
    --output "$OUT/bench_minatar_overhead.md"
for accelerator in "$ACCELERATOR" cpu; do
    flag=()
    [ "$accelerator" = gpu ] && flag=(--accelerator gpu)  # the CPU is the example's own choice: no flag
    limit=60
    [ "$accelerator" = gpu ] && limit=100
    run "cartpole_$accelerator" "$limit" python3 examples/dqn_cartpole.py "${flag[@]}" --seed 1 --no-progress-bar \
        --total-timesteps "$CARTPOLE_STEPS" --runs-dir "$OUT/runs_cartpole_$accelerator"
done

field() { grep -a -m1 "^$2" "$OUT/$1.log" | sed "s/^$2 *//"; }
echo
echo "================ summary ================"
cat "$OUT/environment.txt"
echo
echo "| run | result |"
echo "|---|---|"
echo "| MinAtar defaults, GPU, seed 1: training | $(field minatar_gpu training) |"
echo "| MinAtar: speed | $(field minatar_gpu speed) |"
echo "| MinAtar: eval return | $(field minatar_gpu 'eval return') |"
echo "| MinAtar: per channel | $(grep -a -A4 '^attribution of V' "$OUT/minatar_gpu.log" | tail -4 | awk '{$1 = $1; print}' | paste -sd ';' | sed 's/;/; /g') |"
echo "| MinAtar: whole script | $(tail -1 "$OUT/minatar_gpu.log") |"
for accelerator in "$ACCELERATOR" cpu; do
    echo "| CartPole $CARTPOLE_STEPS steps, $accelerator: device | $(field "cartpole_$accelerator" device) |"
    echo "| CartPole $CARTPOLE_STEPS steps, $accelerator: training | $(field "cartpole_$accelerator" training) |"
    echo "| CartPole $CARTPOLE_STEPS steps, $accelerator: whole script | $(tail -1 "$OUT/cartpole_$accelerator.log") |"
done
echo
[ -f "$OUT/bench_minatar_overhead.md" ] && cat "$OUT/bench_minatar_overhead.md"
