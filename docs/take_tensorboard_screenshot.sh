#!/usr/bin/env bash
# Take a headless-Chromium screenshot of a local TensorBoard
# serving one real run of examples/dqn_cartpole.py.
#
#   bash docs/take_tensorboard_screenshot.sh RUN_DIR [OUTPUT.png] [VIEW]
#
# RUN_DIR is a run folder (runs/CartPole-v1__dqn_cartpole__1__<time>). VIEW is the
# part of the URL after '#'; the default is the scalars page filtered to the
# per-feature mean |attribution| and the worst completeness error, with the
# training curves below. 'custom_scalars' shows the callback's layout (features
# of a run on one chart), 'images' the top-features bar chart and the heatmap.
# Needs Debian's chromium (apt-get install -y chromium) and tensorboard. The README's
# pictures stack a Scalars view over the Images cards: docs/compose_screenshot.py.
set -euo pipefail
RUN_DIR=${1:?usage: $0 RUN_DIR [OUTPUT.png] [VIEW]}
OUTPUT=${2:-docs/images/tensorboard.png}
VIEW=${3:-scalars&tagFilter=ig%2F(mean_abs%7Ccompleteness%2Fworst)&_smoothingWeight=0}
PYTHON=${PYTHON:-python3}
CHROMIUM=${CHROMIUM:-chromium}

PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
PROFILE=$(mktemp -d)
LOG=$(mktemp)
"$PYTHON" -m tensorboard.main --logdir "$RUN_DIR" --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
TB_PID=$!
cleanup() { kill "$TB_PID" 2>/dev/null || true; wait "$TB_PID" 2>/dev/null || true; rm -rf "$PROFILE" "$LOG"; }
trap cleanup EXIT

# Wait until the server answers and has read the run's scalars.
for _ in $(seq 1 120); do
    if curl -sf "http://127.0.0.1:$PORT/data/plugin/scalars/tags" | grep -q 'ig/completeness'; then break; fi
    sleep 1
done
curl -sf "http://127.0.0.1:$PORT/data/plugin/scalars/tags" | grep -q 'ig/completeness' || { cat "$LOG"; exit 1; }

# The legacy dashboards (scalars, images, text, custom_scalars) read their state after '#'; Time Series reads
# query parameters: a VIEW starting with '?' is used as it is ('?tagFilter=ig%2F#timeseries').
case "$VIEW" in
    \?*) URL="http://127.0.0.1:$PORT/$VIEW" ;;
    *) URL="http://127.0.0.1:$PORT/#$VIEW" ;;
esac
mkdir -p "$(dirname "$OUTPUT")"
"$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$PROFILE" --window-size=1600,1200 --hide-scrollbars \
    --virtual-time-budget=20000 --screenshot="$OUTPUT" \
    "$URL"
ls -l "$OUTPUT"
