# Sourced by scripts that measure against the real packs (scripts/bench-tools, scripts/load-test,
# scripts/bench-speculation): start `berth serve` (release build) on Qwen2.5-Coder 0.5B or
# Gemma 3 270M from a temporary home, or llama.cpp's `llama-server` from the build
# scripts/llamacpp-reference makes, and stop them on exit.
# Callers set $root; these functions set berth_url / llamacpp_url and remember the pids.

real_model="${BERTH_CACHE:-$HOME/.cache/berth}/models/qwen2.5-coder-0.5b-instruct.gguf"
real_gemma_model="${BERTH_CACHE:-$HOME/.cache/berth}/models/gemma-3-270m-q4_k_m.gguf"
# The Gemma GGUF embeds no chat template (its pack is completion-only): the chat routes use the
# Gemma 3 instruct template from the shared fixtures (no system role: user/assistant turns only);
# $real_gemma_template names another.
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
# BERTH_PARALLEL, BERTH_QUEUE, BERTH_SPECULATION, ...) passes through.
start_berth_real() {
  start_berth_pack qwen2.5-coder:0.5b "$real_model" libberth_qwen3.so berth-plugin-qwen3
}

# The same on the real Gemma 3 270M pack (plugin berth-plugin-gemma), with the chat template
# above when the shared fixtures are there (else /v1/completions only).
start_berth_gemma() {
  start_berth_pack gemma3:270m "$real_gemma_model" libberth_gemma.so berth-plugin-gemma \
    "${real_gemma_template:-$root/../shared/fixtures/gemma3-270m/chat_template.jinja}"
}

# start_berth_pack NAME GGUF PLUGIN_LIB PLUGIN_PACKAGE [TEMPLATE]: imports GGUF as NAME (with the
# Jinja chat TEMPLATE when that file exists) into the temporary home, installs
# target/release/PLUGIN_LIB there and starts the release `berth serve`; sets berth_url.
start_berth_pack() {
  local name="$1" model="$2" berth="$root/target/release/berth" plugin="$root/target/release/$3" f pid
  local template=()
  for f in "$berth" "$plugin"; do
    [ -e "$f" ] || { echo "$f missing (cargo build --release -p berth -p $4)" >&2; return 1; }
  done
  [ -e "$model" ] || { echo "$model missing (scripts/fetch-models)" >&2; return 1; }
  if [ -n "${5:-}" ]; then
    if [ -e "$5" ]; then template=(--template "$5"); else echo "$5 missing: $name serves completions only" >&2; fi
  fi
  real_tmp_home
  BERTH_HOME="$real_home" "$berth" import "$model" --name "$name" ${template[@]+"${template[@]}"} >/dev/null
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

# import_tiny_vision NAME: the tiny random-weight LFM2-VL (../shared/fixtures/reference-tiny-vision/
# lfm2_vl) made into a pack by scripts/lib/tiny_vision_pack.py and imported as NAME into the
# temporary home, with target/release/libberth_lfm2.so installed there: a server started afterwards
# serves it beside the other packs (scripts/load-test --soak sends it images). Returns 1, with why
# on stderr, when the binary, the plugin or the fixtures are missing.
import_tiny_vision() {
  local berth="$root/target/release/berth" plugin="$root/target/release/libberth_lfm2.so" f
  for f in "$berth" "$plugin"; do
    [ -e "$f" ] || { echo "$f missing (cargo build --release -p berth -p berth-plugin-lfm2)" >&2; return 1; }
  done
  real_tmp_home
  BERTH_HOME="$real_home" python3 "$root/scripts/lib/tiny_vision_pack.py" lfm2_vl "$1" --berth "$berth" || return 1
  BERTH_HOME="$real_home" "$berth" plugins install "$plugin" >/dev/null || return 1
}

# The bin directory of the native llama.cpp build (never the -avx2 one scripts/bench -k avx2 uses).
llamacpp_native_bin() {
  ls -d "${BERTH_CACHE:-$HOME/.cache/berth}"/llamacpp/build-*/bin | grep -v -- -avx2 | tail -1
}

# Builds llama.cpp if needed (scripts/llamacpp-reference build) and starts its server on the same
# GGUF with --jinja and $1 threads; sets llamacpp_url.
start_llamacpp_real() {
  local threads="$1" bin port pid
  [ -e "$real_model" ] || { echo "$real_model missing (scripts/fetch-models)" >&2; return 1; }
  "$root/scripts/llamacpp-reference" build >&2
  bin="$(llamacpp_native_bin)"
  real_tmp_home
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  LD_LIBRARY_PATH="$bin" "$bin/llama-server" -m "$real_model" --jinja --host 127.0.0.1 --port "$port" \
    -t "$threads" -c 4096 -np 1 >"$real_home/llamacpp.log" 2>&1 &
  pid=$!
  real_pids="$real_pids $pid"
  llamacpp_url="http://127.0.0.1:$port"
  await_llamacpp "$pid" "$real_home/llamacpp.log"
}

# --- Embeddings (scripts/bench-embeddings) ---------------------------------------------------
real_embedding_dir="${BERTH_CACHE:-$HOME/.cache/berth}/models/embeddinggemma-300m"
real_embedding_gguf="${BERTH_CACHE:-$HOME/.cache/berth}/models/embeddinggemma-300m-f32.gguf"

# real_import_berth NAME SOURCE PLUGIN_LIB PLUGIN_PACKAGE: imports SOURCE (a GGUF or a model
# folder) as NAME into the temporary home, once per home, and installs target/release/PLUGIN_LIB
# there. Servers started afterwards by start_berth_home serve it.
real_import_berth() {
  local name="$1" source="$2" berth="$root/target/release/berth" plugin="$root/target/release/$3" f
  for f in "$berth" "$plugin"; do
    [ -e "$f" ] || { echo "$f missing (cargo build --release -p berth -p $4)" >&2; return 1; }
  done
  [ -e "$source" ] || { echo "$source missing (scripts/fetch-models)" >&2; return 1; }
  real_tmp_home
  if [ ! -e "$real_home/.imported-${name//[:\/]/_}" ]; then
    # shellcheck disable=SC2086 # BERTH_IMPORT_ARGS is a list of flags (e.g. --quantize q8_0)
    BERTH_HOME="$real_home" "$berth" import "$source" --name "$name" ${BERTH_IMPORT_ARGS:-} >/dev/null
    touch "$real_home/.imported-${name//[:\/]/_}"
  fi
  BERTH_HOME="$real_home" "$berth" plugins install "$plugin" >/dev/null
}

# Starts the release `berth serve` on the temporary home as it is (what real_import_berth put
# there); sets berth_url and berth_pid. Extra env (BERTH_THREADS, BERTH_KEEP_ALIVE, ...) passes
# through. Stop it with stop_real_pid "$berth_pid" before starting another on the same home.
start_berth_home() {
  local berth="$root/target/release/berth" pid
  real_tmp_home
  BERTH_HOME="$real_home" BERTH_PLUGIN_PATH="$real_home/plugins" "$berth" serve --port 0 >"$real_home/serve.log" 2>&1 &
  pid=$!
  real_pids="$real_pids $pid"
  berth_pid="$pid"
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

# start_berth_embedding [NAME] [DIR]: `berth serve` with the sentence-transformers folder DIR
# (default EmbeddingGemma-300M from scripts/fetch-models) imported as NAME (default
# embeddinggemma:300m) and the Gemma plugin; sets berth_url and berth_pid.
start_berth_embedding() {
  real_import_berth "${1:-embeddinggemma:300m}" "${2:-$real_embedding_dir}" libberth_gemma.so berth-plugin-gemma
  start_berth_home
}

# make_embedding_gguf [OUTTYPE]: makes $real_embedding_gguf (f32; with OUTTYPE q8_0 the file
# named -q8_0.gguf beside it) from $real_embedding_dir with llama.cpp's own
# convert_hf_to_gguf.py from the sdist scripts/llamacpp-reference unpacked, Dense modules
# included (--sentence-transformers-dense-modules), in the sentence-transformers venv
# (~/.cache/berth/st-venv, see scripts/embedding-reference) plus sentencepiece, protobuf and
# requests. Does nothing when the GGUF is there.
make_embedding_gguf() {
  local cache="${BERTH_CACHE:-$HOME/.cache/berth}" conv py outtype="${1:-f32}"
  local out="${real_embedding_gguf%-f32.gguf}-$outtype.gguf"
  [ -e "$out" ] && return 0
  conv="$(ls -d "$cache"/llamacpp/src/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | tail -1)"
  py="$cache/st-venv/bin/python"
  [ -n "$conv" ] && [ -e "$conv/convert_hf_to_gguf.py" ] || { echo "llama.cpp source missing (scripts/llamacpp-reference build)" >&2; return 1; }
  [ -x "$py" ] || { echo "$py missing (see scripts/embedding-reference)" >&2; return 1; }
  "$py" -c 'import sentencepiece, google.protobuf, requests' 2>/dev/null ||
    "$cache/st-venv/bin/pip" install --quiet sentencepiece protobuf requests >&2
  "$py" "$conv/convert_hf_to_gguf.py" "$real_embedding_dir" --outtype "$outtype" --sentence-transformers-dense-modules \
    --outfile "$out.part" >&2
  mv "$out.part" "$out"
}

# start_llamacpp_embedding THREADS [GGUF] [EXTRA llama-server ARGS...]: llama.cpp's server with
# --embeddings --pooling mean on GGUF (default $real_embedding_gguf) and THREADS threads (batch
# threads too); sets llamacpp_url and llamacpp_pid. The log is $real_home/llamacpp-embed.log.
start_llamacpp_embedding() {
  local threads="$1" gguf="${2:-$real_embedding_gguf}" bin port pid
  shift; [ $# -gt 0 ] && shift
  [ -e "$gguf" ] || { echo "$gguf missing (make_embedding_gguf)" >&2; return 1; }
  "$root/scripts/llamacpp-reference" build >&2
  bin="$(llamacpp_native_bin)"
  real_tmp_home
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  LD_LIBRARY_PATH="$bin" "$bin/llama-server" -m "$gguf" --embeddings --pooling mean --host 127.0.0.1 \
    --port "$port" -t "$threads" -tb "$threads" "$@" >"$real_home/llamacpp-embed.log" 2>&1 &
  pid=$!
  real_pids="$real_pids $pid"
  llamacpp_pid="$pid"
  llamacpp_url="http://127.0.0.1:$port"
  await_llamacpp "$pid" "$real_home/llamacpp-embed.log"
}

# await_llamacpp PID LOG: waits (up to 2 minutes) until the llama-server PID started at
# $llamacpp_url answers /health; prints its LOG and fails if it exits first.
await_llamacpp() {
  for _ in $(seq 1 600); do
    curl -sf "$llamacpp_url/health" >/dev/null 2>&1 && return 0
    kill -0 "$1" 2>/dev/null || { cat "$2" >&2; return 1; }
    sleep 0.2
  done
  echo "llama-server did not start" >&2
  return 1
}

# stop_real_pid PID: stops one server started here (and forgets it).
stop_real_pid() {
  local p rest=""
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  for p in $real_pids; do [ "$p" = "$1" ] || rest="$rest $p"; done
  real_pids="$rest"
}

# start_llamacpp_parallel THREADS SLOTS [GGUF]: llama.cpp's server (the native build) with
# continuous batching over SLOTS slots (-np, a context of 1024 per slot) on GGUF (default
# $real_model) with --jinja and THREADS threads (batch threads too); sets llamacpp_url and
# llamacpp_pid (scripts/bench-parallel). The log is $real_home/llamacpp-parallel.log.
start_llamacpp_parallel() {
  local threads="$1" slots="$2" gguf="${3:-$real_model}" bin port pid
  [ -e "$gguf" ] || { echo "$gguf missing (scripts/fetch-models)" >&2; return 1; }
  "$root/scripts/llamacpp-reference" build >&2
  bin="$(llamacpp_native_bin)"
  real_tmp_home
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  LD_LIBRARY_PATH="$bin" "$bin/llama-server" -m "$gguf" --jinja --host 127.0.0.1 --port "$port" \
    -t "$threads" -tb "$threads" -np "$slots" -c "$((slots * 1024))" -cb >"$real_home/llamacpp-parallel.log" 2>&1 &
  pid=$!
  real_pids="$real_pids $pid"
  llamacpp_pid="$pid"
  llamacpp_url="http://127.0.0.1:$port"
  await_llamacpp "$pid" "$real_home/llamacpp-parallel.log"
}
