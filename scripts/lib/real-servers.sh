# Sourced by scripts that measure against the real Qwen2.5-Coder pack (scripts/bench-tools,
# scripts/load-test): start `berth serve` (release build) from a temporary home, or llama.cpp's
# `llama-server` from the build scripts/llamacpp-reference makes, and stop them on exit.
# Callers set $root; these functions set berth_url / llamacpp_url and remember the pids.

real_model="${BERTH_CACHE:-$HOME/.cache/berth}/models/qwen2.5-coder-0.5b-instruct.gguf"
real_pids=""
real_home=""

# Stops every server started here and removes the temporary home.
real_cleanup() {
  for pid in $real_pids; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  if [ -n "$real_home" ]; then rm -rf "$real_home"; fi
}

# Makes the temporary home once.
real_tmp_home() {
  [ -n "$real_home" ] || real_home="$(mktemp -d)"
}

# Starts the release `berth serve` on the real Qwen pack; sets berth_url. Extra env (BERTH_THREADS,
# BERTH_PARALLEL, BERTH_QUEUE) passes through.
start_berth_real() {
  local berth="$root/target/release/berth" plugin="$root/target/release/libberth_qwen3.so" f pid
  for f in "$berth" "$plugin"; do
    [ -e "$f" ] || { echo "$f missing (cargo build --release -p berth -p berth-plugin-qwen3)" >&2; return 1; }
  done
  [ -e "$real_model" ] || { echo "$real_model missing (scripts/fetch-models)" >&2; return 1; }
  real_tmp_home
  BERTH_HOME="$real_home" "$berth" import "$real_model" --name qwen2.5-coder:0.5b >/dev/null
  BERTH_HOME="$real_home" "$berth" plugins install "$plugin" >/dev/null
  # BERTH_PLUGIN_PATH is searched first: the plugin just built serves, never an older copy that
  # scripts/setup installed next to the binary (target/release/lib/berth/plugins).
  BERTH_HOME="$real_home" BERTH_PLUGIN_PATH="$real_home/plugins" "$berth" serve --port 0 >"$real_home/serve.log" 2>&1 &
  pid=$!
  real_pids="$real_pids $pid"
  berth_url=""
  for _ in $(seq 1 300); do
    berth_url="$(grep -o 'listening on http://[0-9.:]*' "$real_home/serve.log" | head -1 | sed 's/listening on //' || true)"
    [ -n "$berth_url" ] && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$real_home/serve.log" >&2; return 1; }
    sleep 0.2
  done
  echo "berth serve did not start" >&2
  return 1
}

# Builds llama.cpp if needed (scripts/llamacpp-reference build) and starts its server on the same
# GGUF with --jinja and $1 threads; sets llamacpp_url.
start_llamacpp_real() {
  local threads="$1" bin port pid
  [ -e "$real_model" ] || { echo "$real_model missing (scripts/fetch-models)" >&2; return 1; }
  "$root/scripts/llamacpp-reference" build >&2
  bin="$(ls -d "${BERTH_CACHE:-$HOME/.cache/berth}"/llamacpp/build-*/bin | tail -1)"
  real_tmp_home
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  LD_LIBRARY_PATH="$bin" "$bin/llama-server" -m "$real_model" --jinja --host 127.0.0.1 --port "$port" \
    -t "$threads" -c 4096 -np 1 >"$real_home/llamacpp.log" 2>&1 &
  pid=$!
  real_pids="$real_pids $pid"
  llamacpp_url="http://127.0.0.1:$port"
  for _ in $(seq 1 600); do
    curl -sf "$llamacpp_url/health" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$real_home/llamacpp.log" >&2; return 1; }
    sleep 0.2
  done
  echo "llama-server did not start" >&2
  return 1
}
