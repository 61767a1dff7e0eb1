#!/usr/bin/env bash
# Start-up time, TTFT and output tokens/s for 1 and 8 concurrent streams, through lengthwise
# (fcfs) and through vLLM's own OpenAI server, same model, same max_num_seqs, same client
# (vLLM's `bench serve`, random prompts of 64 tokens, 128 forced output tokens).
# Usage: bench/skeleton_figures.sh [MODEL_DIR] [OUT_DIR]     (run from the repo root)
set -euo pipefail
MODEL=${1:-models/smollm2-135m-instruct}
OUT=${2:-out/skeleton}
NAME=$(basename "$MODEL")
PORT=8123
PY=.venv/bin/python
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1

wait_ready() {  # prints seconds from launch until /health (or /v1/models) answers
  local start=$1 url=$2
  until curl -sf "$url" >/dev/null; do sleep 0.2; done
  echo "$(( $(date +%s%N) - start ))" | awk '{printf "%.1f", $1/1e9}'
}

load() {  # system concurrency prompts
  $PY -m bench.vllm_bench_serve --backend openai-chat --base-url "http://127.0.0.1:$PORT" \
    --endpoint /v1/chat/completions --model "$NAME" --tokenizer "$MODEL" \
    --dataset-name random --random-input-len 64 --random-output-len 128 --ignore-eos \
    --num-prompts "$3" --max-concurrency "$2" --seed 0 \
    --save-result --result-dir "$OUT" --result-filename "$1-c$2.json" > "$OUT/$1-c$2.log" 2>&1
  $PY - "$OUT/$1-c$2.json" "$1" "$2" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:10s} c={sys.argv[3]}  mean TTFT {r['mean_ttft_ms']:7.1f} ms  "
      f"p99 TTFT {r['p99_ttft_ms']:7.1f} ms  mean TPOT {r['mean_tpot_ms']:6.1f} ms  "
      f"output {r['output_throughput']:6.1f} tok/s  completed {r['completed']}")
PYEOF
}

run_system() {  # name, command...
  local name=$1; shift
  local start; start=$(date +%s%N)
  "$@" > "$OUT/$name-server.log" 2>&1 &
  local pid=$!
  echo "$name start-up: $(wait_ready "$start" "http://127.0.0.1:$PORT/health") s"
  load "$name" 1 4
  load "$name" 8 16
  kill -TERM "$pid"; wait "$pid" || true
}

cat > "$OUT/lengthwise.toml" <<TOML
[server]
port = $PORT
[model]
path = "$MODEL"
[engine]
max_num_seqs = 8
[scheduler]
policy = "fcfs"
max_running = 8
TOML
run_system lengthwise .venv/bin/lengthwise serve --config "$OUT/lengthwise.toml"
run_system vllm $PY -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name "$NAME" --port "$PORT" --max-num-seqs 8 --max-model-len 2048 \
  --enforce-eager --disable-log-stats
