#!/usr/bin/env bash
# The GPU check, for a session that is lent an NVIDIA machine (never CI): the benchmark rows on
# the GPU backends packed (cuda where it builds, wgpu through Vulkan) beside PyTorch eager on
# the same GPU (scripts/peer_nanogpt.py, peer_sae_step.py), then the parity suite, the
# attribution, graph, QK, kernel and SAE tests on those backends, as far as the budget goes.
#
#   here:  scripts/device_check.sh pack   builds `burnlens` and the suites' test binary
#                                         (tests/gpu.rs) with --features $FEATURES (default
#                                         wgpu; no GPU toolkit is needed at build time) and packs
#                                         each, stripped, into its archive in .gpu/ (ignored)
#   there: scripts/device_check.sh run    with an archive, .gpu/built_in, .gpu/backends and .gl
#                                         carried (.gl: the Vulkan loader's Debian packages,
#                                         /work/.library/device/README.md)
#
# The test binaries read their fixtures through the path they were built in (/work/main), so
# `run` links that path to the checkout it runs in. Results: $OUT/log and $OUT/bench.jsonl.
# A dry run on a machine without a GPU: `BACKENDS=wgpu PEER_DEVICE=cpu` (wgpu through Mesa's
# lavapipe, PyTorch on the cores).
#
# On a lent GPU, two calls back to back (each carries at most 64 MiB, the repository included):
#   carry [.gpu/burnlens.tar.xz, .gpu/built_in, .gpu/backends, .gl]   scripts/device_check.sh run
#   carry [.gpu/gpu.tar.xz, .gpu/built_in, .gpu/backends, .gl]        SECTIONS=tests scripts/device_check.sh run
# The first times the rows (the sections other than tests), the second runs the suites.
# Fusion against no fusion: pack again with GPU_DIR=.gpu-fused FEATURES=cuda,wgpu,fusion, and
# a third call carries [.gpu-fused/burnlens.tar.xz, .gpu-fused/built_in, .gpu-fused/backends,
# .gl] and runs GPU_DIR=.gpu-fused SECTIONS="bench sae" scripts/device_check.sh run.
set -uo pipefail
# cuda: burn 0.22's cubecl-cuda links LLVM (tracel-llvm-bundler); `cargo xtask cuda-llvm` puts
# it where the bundler looks (no network at build time), then pack with FEATURES=cuda,wgpu;
# FEATURES=cuda,wgpu,fusion packs the same with Burn's operation fusion (see README's GPU
# paragraph), to time against an unfused pack's rows.
FEATURES=${FEATURES:-wgpu}
# Where `pack` writes and `run` reads the archives: a second folder (GPU_DIR=.gpu-fused) keeps
# a pack of other features beside the first, so both can be timed in one GPU session.
GPU_DIR=${GPU_DIR:-.gpu}
cd "$(dirname "$0")/.."

pack() {
    set -e
    local bins name exe
    bins=$(cargo build --features "$FEATURES" --bin burnlens --test gpu --message-format=json \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])')
    rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR"
    # One archive a binary, each carried by its own call: with `cuda` each binary links
    # cubecl-cuda's LLVM (140-165 MB stripped, 31-36 MB in xz), and a call carries 64 MiB
    # with the repository (23 MB) and .gl.
    while read -r name exe; do
        mkdir -p "$GPU_DIR/$name/bin" && cp "$exe" "$GPU_DIR/$name/bin/$name" && strip "$GPU_DIR/$name/bin/$name"
        tar -C "$GPU_DIR/$name" -cf - bin | xz -9 -T2 >"$GPU_DIR/$name.tar.xz"
        rm -rf "$GPU_DIR/$name"
    done <<<"$bins"
    pwd >$GPU_DIR/built_in
    echo "$FEATURES" | tr ',' ' ' >$GPU_DIR/backends
    grep -qx "/$GPU_DIR/" "$(git rev-parse --git-common-dir)/info/exclude" || echo "/$GPU_DIR/" >>"$(git rev-parse --git-common-dir)/info/exclude"
    ls -la "$GPU_DIR"
    echo "carry $GPU_DIR/burnlens.tar.xz (the rows) or $GPU_DIR/gpu.tar.xz (the suites), with $GPU_DIR/built_in, $GPU_DIR/backends and .gl"
}

# Device time is short (15 minutes a session, the machine's start included; at most 10 a
# call), so `run` works through SECTIONS in order — by default the timed rows first (what no
# other machine can measure), then the correctness suites — and starts a section, a row or a
# suite only while its usual length fits in what is left of BUDGET_S seconds (default 480),
# saying what it skipped. Each `== section` line gives the seconds since the start.
#   SECTIONS   bench sae matmul select tests dash graph (any subset, in the order given)
#   BACKENDS   the GPU backends to use (default: those packed, cuda first)
#   PEERS      PyTorch peers of the bench rows (default lean; add hf for transformers)
#   PEER_DEVICE  where PyTorch runs (default cuda; cpu for a dry run on a machine without one)
#   GPT2_CONFIG  the random model's GPT2Config arguments as JSON (default GPT-2 small's)
#   SAE_STEPS, SAE_FEATURES, DASH_TOKENS, GRAPH_TOKENS  the SAE rows' steps (20) and width
#              (24576), the dashboards' tokens (262144), the graph's prompt (512)
BUDGET_S=${BUDGET_S:-480}
START_S=$SECONDS
PEER_DEVICE=${PEER_DEVICE:-cuda}
export PEER_DEVICE

# Seconds left of the budget.
left() { echo $((BUDGET_S - (SECONDS - START_S))); }

# `fits NAME SECONDS`: whether NAME (needing about SECONDS) still fits; says so when it does not.
fits() {
    if [ "$(left)" -lt "$2" ]; then
        echo "-- skipped $1: needs ~$2 s, $(left) s of ${BUDGET_S} left"
        return 1
    fi
}

# `limit SECONDS`: a command's timeout, never past the budget.
limit() {
    local l; l=$(left)
    echo $(($1 < l ? $1 : (l > 5 ? l : 5)))
}

section() { echo "== $1 (at $((SECONDS - START_S)) s)"; }

run() {
    local out=${OUT:-/tmp/out} root=$PWD
    mkdir -p "$out"
    exec > >(tee "$out/log") 2>&1
    local built_in; built_in=$(cat $GPU_DIR/built_in)
    [ -e "$built_in" ] || { mkdir -p "$(dirname "$built_in")"; ln -s "$root" "$built_in"; }
    for f in .gl/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done; ldconfig 2>/dev/null
    local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    [ -f "$icd" ] && export VK_DRIVER_FILES=$icd
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    local archive
    for archive in $GPU_DIR/*.tar.xz; do [ -e "$archive" ] && tar -C "$GPU_DIR" -xJf "$archive"; done
    BIN=$GPU_DIR/bin
    # cuda first: its rows are the ones no earlier run has measured.
    BACKENDS=${BACKENDS:-$(tr ' ' '\n' <$GPU_DIR/backends | grep -E '^(cuda|wgpu)$' | sort | tr '\n' ' ')}
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | head -3
    nproc; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    echo "built with --features $(tr ' ' ',' <$GPU_DIR/backends); backends: $BACKENDS; peers on $PEER_DEVICE; budget $BUDGET_S s"
    [ -x $BIN/burnlens ] && $BIN/burnlens backends
    MODEL=/tmp/gpt2-small
    # The random GPT-2 the rows run (the suites read their own fixtures).
    [ "${SECTIONS:-}" = tests ] || python3 -c "
import json, os, torch, transformers
torch.manual_seed(0)
config = transformers.GPT2Config(**json.loads(os.environ.get('GPT2_CONFIG') or '{}'))
transformers.GPT2LMHeadModel(config).save_pretrained('$MODEL')" 2>&1 | tail -1
    local s
    for s in ${SECTIONS:-bench sae matmul select tests dash graph}; do
        # The suites come in .gpu/gpu.tar.xz, every other section needs .gpu/burnlens.tar.xz.
        if [ "$s" = tests ]; then [ -x $BIN/gpu ]; else [ -x $BIN/burnlens ]; fi || { echo "-- skipped $s: its binary was not carried"; continue; }
        case $s in
            bench) section "bench: the model against PyTorch eager on $PEER_DEVICE"; bench_rows "$out" ;;
            sae) fits "SAE rows" 120 && { section "SAE training steps"; sae_rows "$out"; } ;;
            matmul) fits "products" 40 && { section "f32 products"; matmul_rows; } ;;
            select) fits "selection" 40 && { section "TopK selection"; select_rows; } ;;
            tests) test_suites ;;
            dash) fits "dashboards" 120 && { section "dashboards"; dashboard_rows "$out"; } ;;
            graph) fits "graph" 150 && { section "attribution graph"; graph_rows "$out"; } ;;
            *) echo "-- unknown section $s (bench sae matmul select tests dash graph)" ;;
        esac
    done
    section "done"
}

# The correctness suites on each GPU backend, each only if its usual length still fits.
test_suites() {
    local backend
    for backend in $BACKENDS; do
        suite "parity on $backend" 120 240 env BURNLENS_TEST_BACKENDS=$backend $BIN/gpu parity:: --test-threads 1 --nocapture -- "parity .*|test result.*|panicked.*|FAILED.*|error.*"
        suite "parity on $backend with --compute tf32 (TF32 where the GPU has it; expected past 1e-4)" 40 90 \
            env BURNLENS_COMPUTE=tf32 BURNLENS_TEST_BACKENDS=$backend $BIN/gpu parity::gpt2 --test-threads 1 --nocapture -- "parity .*"
        suite "attribution on $backend" 60 240 env BURNLENS_TEST_BACKENDS=$backend $BIN/gpu attribution::gradients_and_attribution_agree_on_every_backend -- "test result.*|panicked.*|FAILED.*"
        suite "attribution graphs against circuit-tracer's on $backend" 90 240 \
            env BURNLENS_TEST_BACKENDS=$backend $BIN/gpu trace::graphs_equal --nocapture -- "adjacency rel.*|test result.*|panicked.*|FAILED.*"
        suite "QK attributions adding up to the model's scores on $backend" 60 120 \
            env BURNLENS_TEST_BACKENDS=$backend $BIN/gpu trace::qk_terms_add_up -- "test result.*|panicked.*|FAILED.*"
    done
    # burnlens's own CubeCL kernels against the host rules, bit for bit; SAE steps and evals
    # on the tensor path against sae-lens's, through the exact f32 products (never TF32).
    suite "own kernels on $BACKENDS" 90 240 $BIN/gpu gpu_kernels:: -- "test result.*|panicked.*|FAILED.*|left.*|right.*"
    # The one-launch kernels (norms, softmax and attention's pattern, gated activations,
    # decoding's attention, Adam's step) against f64 and the composed ops they replace.
    suite "one-launch kernels on $BACKENDS" 60 180 $BIN/gpu gpu_row_kernels:: gpu_attention:: gpu_adam:: -- "test result.*|panicked.*|FAILED.*|worst.*"
    suite "SAE steps on $BACKENDS" 60 180 $BIN/gpu sae_training::on_a_gpu_backend -- "test result.*|panicked.*|FAILED.*|differs.*"
    suite "SAE evals on $BACKENDS" 45 120 $BIN/gpu sae_eval::on_a_gpu_backend -- "test result.*|panicked.*|FAILED.*|vs sae-lens.*"
}

# `suite NAME USUAL_S TIMEOUT_S COMMAND... -- PATTERN`: COMMAND if USUAL_S fits, its lines
# matching PATTERN shown.
suite() {
    local name=$1 usual=$2 cap=$3; shift 3
    local cmd=()
    while [ "$1" != -- ]; do cmd+=("$1"); shift; done
    fits "$name" "$usual" || return 0
    section "$name"
    timeout "$(limit "$cap")" "${cmd[@]}" 2>&1 | grep -oE "$2" | head -60
}

# The model's rows: burnlens on each backend and the PyTorch peers, the same shapes; then the
# table of medians.
bench_rows() {
    local out=$1 model=$MODEL
    local jsonl="$out/bench.jsonl"
    row "forward 1x128" 25 forward --model $model --batch 1 --seq 128 --reps 20 -- forward --model $model --batch 1 --seq 128 --reps 20
    row "forward 8x1024" 40 forward --model $model --batch 8 --seq 1024 --reps 10 -- forward --model $model --batch 8 --seq 1024 --reps 10
    row "generate 64" 40 generate --model $model --new-tokens 64 --reps 3 -- generate --model $model --new 64 --reps 3
    row "train shakespeare-char" 40 train --train-shape shakespeare-char --reps 5 -- train-steps --train-shape shakespeare-char --reps 5
    row "train gpt2 ctx256" 40 train --train-shape gpt2 --reps 5 -- train-steps --train-shape gpt2 --reps 5
    # The same without the one-launch norms, softmax and activations (Burn's composed ops;
    # burnlens only: the PyTorch rows above stand for these too).
    ROW_ENV=BURNLENS_GPU_ROW_KERNELS=off PEERS=none row "generate 64, composed ops" 30 generate --model $model --new-tokens 64 --reps 3 -- none
    ROW_ENV=BURNLENS_GPU_ROW_KERNELS=off PEERS=none row "train gpt2 ctx256, composed ops" 30 train --train-shape gpt2 --reps 5 -- none
    # One kernel left out at a time where its gain is least certain: decoding's attention (a
    # cube per query of a head walks every key), Adam's step, and (below) a prompt's attention.
    ROW_ENV=BURNLENS_GPU_ROW_KERNELS=decode PEERS=none row "generate 64, decoding attention composed" 30 generate --model $model --new-tokens 64 --reps 3 -- none
    ROW_ENV=BURNLENS_GPU_ROW_KERNELS=adam PEERS=none row "train gpt2 ctx256, Adam composed" 30 train --train-shape gpt2 --reps 5 -- none
    # The prompt's attention written out (exact products, the pattern kernel) instead of
    # cubek's flash kernel on its unit routine.
    ROW_ENV=BURNLENS_GPU_ROW_KERNELS=flash PEERS=none row "forward 8x1024, flash attention left out" 30 forward --model $model --batch 8 --seq 1024 --reps 10 -- none
    # Decoding over a long cache (896-token prompt: the kernel splits each head's keys into
    # ranges), against PyTorch and against the composed attention.
    row "generate 64 after 896" 40 generate --model $model --prompt 896 --new-tokens 64 --reps 3 -- generate --model $model --prompt 896 --new 64 --reps 3
    ROW_ENV=BURNLENS_GPU_ROW_KERNELS=decode PEERS=none row "generate 64 after 896, decoding attention composed" 30 generate --model $model --prompt 896 --new-tokens 64 --reps 3 -- none
    # The same with TF32 asked for on both sides (burnlens's default is its exact f32 kernel).
    row "forward 8x1024 tf32" 40 forward --model $model --batch 8 --seq 1024 --reps 10 --compute tf32 -- forward --model $model --batch 8 --seq 1024 --reps 10 --tf32
    python3 - "$jsonl" <<'EOF'
import json, statistics, sys
rows = {}
try:
    lines = open(sys.argv[1]).readlines()
except OSError:
    lines = []
for line in lines:
    try:
        r = json.loads(line)
    except ValueError:
        continue
    rows.setdefault(r["row"], {})[r["backend"]] = statistics.median(r["times"])
print("| row | burnlens cuda | burnlens wgpu | PyTorch lean | PyTorch HF | cuda / lean | wgpu / lean |")
print("|---|---|---|---|---|---|---|")
for row, t in rows.items():
    ms = lambda k: f"{t[k] * 1e3:.2f} ms" if k in t else "-"
    ratio = lambda k: f"{t['torch-lean'] / t[k]:.2f}x" if k in t and "torch-lean" in t else "-"
    print(f"| {row} | {ms('cuda')} | {ms('wgpu')} | {ms('torch-lean')} | {ms('torch-hf')} | {ratio('cuda')} | {ratio('wgpu')} |")
EOF
}

# `row LABEL USUAL_S BURNLENS_ARGS... -- PEER_ARGS...`: one bench row on every backend and
# peer, appended to `bench_rows`'s $jsonl, if USUAL_S still fits.
row() {
    local label=$1 usual=$2; shift 2
    local ours=() peer=() backend impl
    while [ "$1" != -- ]; do ours+=("$1"); shift; done; shift; peer=("$@")
    fits "$label" "$usual" || return 0
    echo "-- $label (at $((SECONDS - START_S)) s)"
    for backend in $BACKENDS; do
        timeout "$(limit 120)" env ${ROW_ENV:-} $BIN/burnlens bench "${ours[@]}" --backend $backend | sed "s/^{/{\"row\":\"$label\",\"backend\":\"$backend\",/" >>"$jsonl"
    done
    for impl in ${PEERS:-lean}; do
        [ "$impl" = none ] && continue
        [ "$impl" = hf ] && [ "${peer[0]}" = train-steps ] && continue
        timeout "$(limit 180)" python3 scripts/peer_nanogpt.py "${peer[@]}" --impl $impl --device "$PEER_DEVICE" 2>/dev/null \
            | sed "s/^{/{\"row\":\"$label\",\"backend\":\"torch-$impl\",/" >>"$jsonl"
    done
}

# One f32 product at the SAE's encode shape and GPT-2's: burnlens's exact kernel (its
# default) and Burn's (`--compute tf32`), beside torch.matmul with TF32 off and on. Median ms.
matmul_rows() {
    local shape backend compute
    echo "| product | route | ms | TFLOP/s |"
    echo "|---|---|---|---|"
    for shape in 4096x768x24576 1024x768x3072 4096x24576x768; do
        for backend in $BACKENDS; do
            for compute in f32 tf32; do
                timeout "$(limit 120)" $BIN/burnlens bench matmul --backend "$backend" --compute $compute --shape $shape --reps 10 2>/dev/null | python3 -c '
import json, statistics, sys
try:
    d = json.loads(sys.stdin.read())
except ValueError:
    sys.exit(print(f"| {sys.argv[2]} | burnlens {sys.argv[1]} {sys.argv[3]} | failed | |"))
ms = statistics.median(d["times"]) * 1e3
shape, route, tflops = "x".join(str(d[v]) for v in "mkn"), d["route"], d["flops"] / ms / 1e9
print(f"| {shape} | burnlens {sys.argv[1]} {route} | {ms:.2f} | {tflops:.1f} |")' "$backend" "$shape" "$compute"
            done
        done
        timeout "$(limit 120)" python3 - "$shape" <<'EOF'
import os, sys, time, torch
dev = os.environ["PEER_DEVICE"]
m, k, n = map(int, sys.argv[1].split("x"))
a, b = torch.randn(m, k, device=dev), torch.randn(k, n, device=dev)
for tf32 in (False, True):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    ts = []
    for i in range(11):
        t = time.perf_counter()
        c = (a @ b)[0, 0].item()
        ts.append(time.perf_counter() - t)
    ms = sorted(ts[1:])[5] * 1e3
    print(f"| {m}x{k}x{n} | torch.matmul {dev} tf32 {'on' if tf32 else 'off'} | {ms:.2f} | {2 * m * k * n / ms / 1e9:.1f} |")
EOF
    done
}

# TopK's choice alone at GPT-2 small's SAE shape (the k-th largest of each of 4,096 rows of
# 24,576 scores) and BatchTopK's (one row of 4,096 x 24,576, k = 32 x 4,096): burnlens's
# radix kernel and the bisection it replaced, against torch.topk on the same GPU. Median ms.
select_rows() {
    local spec backend route
    echo "| selection | route | ms |"
    echo "|---|---|---|"
    for spec in "4096x24576 32" "1x100663296 131072"; do
        set -- $spec
        for backend in $BACKENDS; do
            for route in chosen bisection; do
                timeout "$(limit 120)" $BIN/burnlens bench select --backend "$backend" --shape "$1" --k "$2" --route $route --reps 10 2>/dev/null | python3 -c '
import json, statistics, sys
try:
    d = json.loads(sys.stdin.read())
except ValueError:
    sys.exit(print(f"| {sys.argv[2]} k {sys.argv[3]} | burnlens {sys.argv[1]} {sys.argv[4]} | failed |"))
rows, width, k, route, ms = d["rows"], d["width"], d["k"], d["route"], statistics.median(d["times"]) * 1e3
print(f"| {rows}x{width} k {k} | burnlens {sys.argv[1]} {route} | {ms:.2f} |")' "$backend" "$1" "$2" "$route"
            done
        done
        timeout "$(limit 120)" python3 - "$1" "$2" <<'EOF'
import os, sys, time, torch
dev = os.environ["PEER_DEVICE"]
rows, width = map(int, sys.argv[1].split("x"))
k = int(sys.argv[2])
x = torch.randn(rows, width, device=dev)
ts = []
for i in range(11):
    t = time.perf_counter()
    v = torch.topk(x, k, dim=1).values[:, -1].cpu()
    ts.append(time.perf_counter() - t)
print(f"| {rows}x{width} k {k} | torch.topk {dev} | {sorted(ts[1:])[5] * 1e3:.2f} |")
EOF
    done
}

# Dashboards of every feature of the SAE `sae_rows` trained (24,576 features), over random
# windows: both passes count on the device and read back only the columns that can enter a
# top group or a quantile sample (`device_batch.rs`).
dashboard_rows() {
    local out=$1 model=$MODEL tokens=${DASH_TOKENS:-262144} backend
    echo "| dashboards, $tokens tokens | burnlens backend | pass 1 (s) | pass 2 (s) | logit effects (s) | tokens/s, pass 1 / pass 2 |"
    echo "|---|---|---|---|---|---|"
    for backend in $BACKENDS; do
        rm -rf "/tmp/dash-$backend"
        timeout "$(limit 300)" $BIN/burnlens dashboards --backend "$backend" --model "$model" --sae "/tmp/sae-$backend/sae" --data random --seq-len 128 \
            --tokens "$tokens" --batch 32 --out "/tmp/dash-$backend" >"$out/dash-$backend.log" 2>&1
        python3 - "/tmp/dash-$backend/run.json" "$backend" "$tokens" <<'EOF'
import json, sys
try:
    s = json.load(open(sys.argv[1]))["run"]["seconds"]
    a, b, c = s["first_pass"], s["second_pass"], s["logits"]
    print(f"| | {sys.argv[2]} | {a:.1f} | {b:.1f} | {c:.1f} | {int(sys.argv[3]) / a:,.0f} / {int(sys.argv[3]) / b:,.0f} |")
except (OSError, ValueError, KeyError, ZeroDivisionError) as e:
    print(f"| | {sys.argv[2]} | failed: {e} | | | |")
EOF
    done
}

# An attribution graph of a GRAPH_TOKENS-token prompt (default 512; the issue's target is
# 1,024) of GPT-2 small with random 24,576-feature transcoders (bench_trace.py's recipe: ReLU,
# ~0.2% firing), `max_feature_nodes` 512, batch 64: on each GPU backend and on this machine's
# cores (flex). Attribution seconds as the command reports them.
graph_rows() {
    local out=$1 model=$MODEL tokens=${GRAPH_TOKENS:-512} tc=/tmp/tc24k backend
    rm -rf "$tc"
    timeout "$(limit 120)" python3 - "$tc" "$model" <<'EOF'
import json, math, os, sys, torch
from safetensors.torch import save_file
out, f = sys.argv[1], 24576
config = json.load(open(os.path.join(sys.argv[2], "config.json")))
d, layers = config["n_embd"], config["n_layer"]
os.makedirs(out, exist_ok=True)
g = torch.Generator().manual_seed(7)
for i in range(layers):
    save_file({"W_enc": torch.randn(f, d, generator=g) / math.sqrt(d), "b_enc": torch.full((f,), -2.88),
               "W_dec": torch.randn(f, d, generator=g) * 0.05, "b_dec": torch.zeros(d)}, os.path.join(out, f"layer_{i}.safetensors"))
open(os.path.join(out, "config.yaml"), "w").write("model_kind: transcoder_set\nfeature_input_hook: ln2.hook_normalized\nfeature_output_hook: hook_mlp_out\n")
EOF
    local ids
    ids=$(python3 -c "import random; r = random.Random(1234); print(','.join(['50256'] + [str(r.randrange(50256)) for _ in range($tokens - 1)]))")
    echo "| graph, $tokens tokens | backend | attribution |"
    echo "|---|---|---|"
    for backend in $BACKENDS flex; do
        timeout "$(limit 400)" $BIN/burnlens graph --backend "$backend" --model "$model" --transcoders "$tc" --ids "$ids" --batch-size 64 \
            --max-feature-nodes 512 --out "/tmp/graph-$backend" >"$out/graph-$backend.log" 2>&1
        echo "| | $backend | $(grep -oE "attributed in [0-9.]+ s" "$out/graph-$backend.log" || echo failed) |"
    done
}

# SAE training at GPT-2 small's shape (24,576 features, 4,096 activations a step, hook
# blocks.6.hook_resid_pre, model passes included): `train-sae` on each GPU backend (its
# steps on the tensor path, chosen by the device) against scripts/peer_sae_step.py, a
# PyTorch loop of SAELens's step on cuda. Seconds a step over the steady steps.
sae_rows() {
    local out=$1 steps=${SAE_STEPS:-20} features=${SAE_FEATURES:-24576} arch backend
    echo "| SAE step | burnlens backend | burnlens s / step | PyTorch s / step | burnlens / PyTorch |"
    echo "|---|---|---|---|---|"
    for arch in topk standard; do
        local peer
        peer=$(timeout "$(limit 240)" python3 scripts/peer_sae_step.py "$MODEL" $arch $steps $features 32 6 "$PEER_DEVICE" 2>/dev/null | tail -1)
        echo "$peer" >>"$out/sae.jsonl"
        for backend in $BACKENDS; do
            sae_row "$out" $arch "$backend" "$peer" "$steps" "$features" ""
        done
        # burnlens's one-launch kernels (Adam's step, the norms, ...) against the composed ops.
        [ $arch = topk ] && sae_row "$out" $arch "${BACKENDS%% *}" "$peer" "$steps" "$features" off
    done
}

# One SAE row: `train-sae` on `backend` (with BURNLENS_GPU_ROW_KERNELS=$7 where given) against
# the peer's line `peer`.
sae_row() {
    local out=$1 arch=$2 backend=$3 peer=$4 steps=$5 features=$6 composed=$7 label=$3
    [ -n "$composed" ] && label="$backend, composed ops"
    rm -rf "/tmp/sae-$backend"
    env ${composed:+BURNLENS_GPU_ROW_KERNELS=$composed} timeout "$(limit 240)" $BIN/burnlens train-sae --backend "$backend" --model "$MODEL" \
        --hook blocks.6.hook_resid_pre --architecture $arch --k 32 --d-sae $features --steps $steps --batch 32 --seq-len 128 \
        --n-batches-in-buffer 2 --data random --checkpoint-every 100000 $([ $arch = standard ] && echo --l1 1) --out "/tmp/sae-$backend" \
        >"$out/sae-$arch-$backend${composed:+-composed}.log" 2>&1
    python3 - "/tmp/sae-$backend/metrics.jsonl" "$peer" $arch "$label" <<'EOF'
import json, statistics, sys
try:
    lines = [json.loads(l) for l in open(sys.argv[1])]
    ours = (lines[-1]["elapsed_s"] - lines[1]["elapsed_s"]) / (len(lines) - 2)
except (OSError, ValueError, IndexError, KeyError, ZeroDivisionError):
    ours = float("nan")
try:
    theirs = statistics.median(json.loads(sys.argv[2])["times"])
except (ValueError, KeyError):
    theirs = float("nan")
print(f"| {sys.argv[3]} | {sys.argv[4]} | {ours:.4f} | {theirs:.4f} | {theirs / ours:.2f}x |")
EOF
}

case "${1:-}" in
    pack) pack ;;
    run) run ;;
    *) echo "usage: scripts/device_check.sh pack|run" >&2; exit 2 ;;
esac
