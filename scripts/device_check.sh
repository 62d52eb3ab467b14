#!/usr/bin/env bash
# The GPU check, for a session that is lent an NVIDIA machine (never CI): the parity suite and
# the attribution tests on the GPU backends packed (wgpu through Vulkan; cuda where it builds), then the benchmark rows on the GPU beside
# PyTorch eager on the same GPU (scripts/peer_nanogpt.py --device cuda).
#
#   here:  scripts/device_check.sh pack   builds with --features $FEATURES (default wgpu; no GPU
#                                         toolkit is needed at build time) and packs
#                                         the stripped binaries into .gpu/ (ignored; carry it)
#   there: scripts/device_check.sh run    with .gpu and .gl carried (.gl: the Vulkan loader's
#                                         Debian packages, /work/.library/device/README.md)
#
# The test binaries read their fixtures through the path they were built in (/work/main), so
# `run` links that path to the checkout it runs in. Results: $OUT/log and $OUT/bench.jsonl.
set -uo pipefail
# cuda: burn 0.22's cubecl-cuda links LLVM (tracel-llvm-bundler); `cargo xtask cuda-llvm` puts
# it where the bundler looks (no network at build time), then pack with FEATURES=cuda,wgpu.
FEATURES=${FEATURES:-wgpu}
cd "$(dirname "$0")/.."

pack() {
    set -e
    local bins
    bins=$(cargo build --features "$FEATURES" --bin burnlens --test parity --test attribution --test trace --test sae_training --test sae_eval --test gpu_kernels --message-format=json \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])')
    rm -rf .gpu && mkdir -p .gpu/bin
    while read -r name exe; do cp "$exe" ".gpu/bin/$name" && strip ".gpu/bin/$name"; done <<<"$bins"
    tar -C .gpu -cJf .gpu/bin.tar.xz bin && rm -rf .gpu/bin
    pwd >.gpu/built_in
    echo "$FEATURES" | tr ',' ' ' >.gpu/backends
    grep -qx '/.gpu/' "$(git rev-parse --git-common-dir)/info/exclude" || echo /.gpu/ >>"$(git rev-parse --git-common-dir)/info/exclude"
    ls -la .gpu
}

run() {
    local out=${OUT:-/tmp/out} root=$PWD
    mkdir -p "$out"
    exec > >(tee "$out/log") 2>&1
    local built_in; built_in=$(cat .gpu/built_in)
    [ -e "$built_in" ] || { mkdir -p "$(dirname "$built_in")"; ln -s "$root" "$built_in"; }
    for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    [ -f "$icd" ] && export VK_DRIVER_FILES=$icd
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    tar -C .gpu -xJf .gpu/bin.tar.xz
    local bin=.gpu/bin backends
    backends=$(cat .gpu/backends)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    nproc; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    echo "== backends"; $bin/burnlens backends
    for backend in ${SKIP_TESTS:+}$( [ -n "${SKIP_TESTS:-}" ] || echo "$backends"); do
        echo "== parity on $backend"
        BURNLENS_TEST_BACKENDS=$backend timeout 240 $bin/parity --test-threads 1 --nocapture 2>&1 | grep -oE "parity .*|test result.*|panicked.*|FAILED.*|error.*" | head -60
        echo "== parity on $backend with --compute tf32 (Burn's products: TF32 where the GPU has it; expected past 1e-4)"
        BURNLENS_COMPUTE=tf32 BURNLENS_TEST_BACKENDS=$backend timeout 90 $bin/parity gpt2 --test-threads 1 --nocapture 2>&1 | grep -oE "parity .*" | head -8
        echo "== attribution on $backend"
        BURNLENS_TEST_BACKENDS=$backend timeout 240 $bin/attribution every_backend 2>&1 | grep -E "test result|panicked|FAILED" | head -20
        echo "== attribution graphs against circuit-tracer's on $backend"
        BURNLENS_TEST_BACKENDS=$backend timeout 240 $bin/trace graphs_equal --nocapture 2>&1 | grep -E "adjacency rel|test result|panicked|FAILED" | head -20
        echo "== QK attributions adding up to the model's scores on $backend"
        BURNLENS_TEST_BACKENDS=$backend timeout 120 $bin/trace qk_terms_add_up 2>&1 | grep -E "test result|panicked|FAILED" | head -20
    done
    # SAE training's steps on the GPU backends (the tensor path, chosen by the device) against
    # sae-lens's, through the exact f32 products (never TF32).
    # burnlens's own CubeCL kernels (model::gpu) against the host rules, bit for bit.
    [ -n "${SKIP_TESTS:-}" ] || { echo "== own kernels on $backends"; timeout 240 $bin/gpu_kernels 2>&1 | grep -E "test result|panicked|FAILED|left|right" | head -20; }
    [ -n "${SKIP_TESTS:-}" ] || { echo "== SAE steps on $backends"; timeout 180 $bin/sae_training on_a_gpu_backend 2>&1 | grep -E "test result|panicked|FAILED|differs" | head -20; }
    [ -n "${SKIP_TESTS:-}" ] || { echo "== SAE evals on $backends"; timeout 120 $bin/sae_eval on_a_gpu_backend 2>&1 | grep -E "test result|panicked|FAILED|vs sae-lens" | head -20; }
    echo "== bench"
    local model=/tmp/gpt2-small
    python3 -c "
import torch, transformers
torch.manual_seed(0)
transformers.GPT2LMHeadModel(transformers.GPT2Config()).save_pretrained('$model')" 2>&1 | tail -1
    local jsonl="$out/bench.jsonl"
    row() { # label, burnlens args..., -- peer args...
        local label=$1; shift
        local ours=() peer=()
        while [ "$1" != -- ]; do ours+=("$1"); shift; done; shift; peer=("$@")
        for backend in $backends; do
            timeout 120 $bin/burnlens bench "${ours[@]}" --backend $backend | sed "s/^{/{\"row\":\"$label\",\"backend\":\"$backend\",/" >>"$jsonl"
        done
        for impl in lean hf; do
            [ "$impl" = hf ] && [ "${peer[0]}" = train-steps ] && continue
            timeout 180 python3 scripts/peer_nanogpt.py "${peer[@]}" --impl $impl --device cuda 2>/dev/null | sed "s/^{/{\"row\":\"$label\",\"backend\":\"torch-$impl\",/" >>"$jsonl"
        done
    }
    row "forward 1x128" forward --model $model --batch 1 --seq 128 --reps 20 -- forward --model $model --batch 1 --seq 128 --reps 20
    row "forward 8x1024" forward --model $model --batch 8 --seq 1024 --reps 10 -- forward --model $model --batch 8 --seq 1024 --reps 10
    # The same with TF32 asked for on both sides (burnlens's default is its exact f32 kernel).
    row "forward 8x1024 tf32" forward --model $model --batch 8 --seq 1024 --reps 10 --compute tf32 -- forward --model $model --batch 8 --seq 1024 --reps 10 --tf32
    row "generate 64" generate --model $model --new-tokens 64 --reps 3 -- generate --model $model --new 64 --reps 3
    row "train shakespeare-char" train --train-shape shakespeare-char --reps 5 -- train-steps --train-shape shakespeare-char --reps 5
    row "train gpt2 ctx256" train --train-shape gpt2 --reps 5 -- train-steps --train-shape gpt2 --reps 5
    python3 - "$jsonl" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    rows.setdefault(r["row"], {})[r["backend"]] = statistics.median(r["times"])
cols = ["cuda", "wgpu", "torch-lean", "torch-hf"]
print("| row | burnlens cuda | burnlens wgpu | PyTorch lean | PyTorch HF | wgpu / lean | cuda / lean |")
print("|---|---|---|---|---|---|---|")
for row, t in rows.items():
    ms = lambda k: f"{t[k] * 1e3:.2f} ms" if k in t else "-"
    ratio = lambda k: f"{t['torch-lean'] / t[k]:.2f}x" if k in t and "torch-lean" in t else "-"
    print(f"| {row} | {ms('cuda')} | {ms('wgpu')} | {ms('torch-lean')} | {ms('torch-hf')} | {ratio('wgpu')} | {ratio('cuda')} |")
EOF
    sae_rows "$model" "$backends" "$out"
    dashboard_rows "$model" "$backends" "$out"
    graph_rows "$model" "$backends" "$out"
    select_rows "$backends"
    matmul_rows "$backends"
}

# One f32 product at the SAE's encode shape and GPT-2's: burnlens's exact kernel (its
# default) and Burn's (`--compute tf32`), beside torch.matmul with TF32 off and on. Median ms.
matmul_rows() {
    local backends=$1
    echo "| product | route | ms | TFLOP/s |"
    echo "|---|---|---|---|"
    for shape in 4096x768x24576 1024x768x3072 4096x24576x768; do
        for backend in $backends; do
            for compute in f32 tf32; do
                timeout 120 .gpu/bin/burnlens bench matmul --backend "$backend" --compute $compute --shape $shape --reps 10 2>/dev/null | python3 -c '
import json, statistics, sys
d = json.loads(sys.stdin.read())
ms = statistics.median(d["times"]) * 1e3
shape, route, tflops = "x".join(str(d[v]) for v in "mkn"), d["route"], d["flops"] / ms / 1e9
print(f"| {shape} | burnlens {sys.argv[1]} {route} | {ms:.2f} | {tflops:.1f} |")' "$backend"
            done
        done
        timeout 120 python3 - "$shape" <<'EOF'
import sys, time, torch
m, k, n = map(int, sys.argv[1].split("x"))
a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
for tf32 in (False, True):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    ts = []
    for i in range(11):
        torch.cuda.synchronize()
        t = time.perf_counter()
        c = (a @ b)[0, 0].item()
        ts.append(time.perf_counter() - t)
    ms = sorted(ts[1:])[5] * 1e3
    print(f"| {m}x{k}x{n} | torch.matmul cuda tf32 {'on' if tf32 else 'off'} | {ms:.2f} | {2 * m * k * n / ms / 1e9:.1f} |")
EOF
    done
}

# TopK's choice alone at GPT-2 small's SAE shape (the k-th largest of each of 4,096 rows of
# 24,576 scores) and BatchTopK's (one row of 4,096 x 24,576, k = 32 x 4,096): burnlens's
# radix kernel and the bisection it replaced, against torch.topk on the same GPU. Median ms.
select_rows() {
    local backends=$1
    echo "| selection | route | ms |"
    echo "|---|---|---|"
    for spec in "4096x24576 32" "1x100663296 131072"; do
        set -- $spec
        for backend in $backends; do
            for route in chosen bisection; do
                timeout 120 .gpu/bin/burnlens bench select --backend "$backend" --shape "$1" --k "$2" --route $route --reps 10 2>/dev/null | python3 -c '
import json, statistics, sys
d = json.loads(sys.stdin.read())
rows, width, k, route, ms = d["rows"], d["width"], d["k"], d["route"], statistics.median(d["times"]) * 1e3
print(f"| {rows}x{width} k {k} | burnlens {sys.argv[1]} {route} | {ms:.2f} |")' "$backend"
            done
        done
        timeout 120 python3 - "$1" "$2" <<'EOF'
import sys, time, torch
rows, width = map(int, sys.argv[1].split("x"))
k = int(sys.argv[2])
x = torch.randn(rows, width, device="cuda")
ts = []
for i in range(11):
    torch.cuda.synchronize()
    t = time.perf_counter()
    v = torch.topk(x, k, dim=1).values[:, -1].cpu()
    ts.append(time.perf_counter() - t)
print(f"| {rows}x{width} k {k} | torch.topk cuda | {sorted(ts[1:])[5] * 1e3:.2f} |")
EOF
    done
}

# SAE training at GPT-2 small's shape (24,576 features, 4,096 activations a step, hook
# blocks.6.hook_resid_pre, model passes included): `train-sae` on each GPU backend (its
# steps on the tensor path, chosen by the device) against scripts/peer_sae_step.py, a
# PyTorch loop of SAELens's step on cuda. Seconds a step over the steady steps.
# Dashboards of every feature of the SAE `sae_rows` trained (24,576 features), over random
# windows: both passes count on the device and read back only the columns that can enter a
# top group or a quantile sample (`device_batch.rs`).
dashboard_rows() {
    local model=$1 backends=$2 out=$3 tokens=${DASH_TOKENS:-262144}
    echo "| dashboards, $tokens tokens | burnlens backend | pass 1 (s) | pass 2 (s) | logit effects (s) | tokens/s, pass 1 / pass 2 |"
    echo "|---|---|---|---|---|---|"
    for backend in $backends; do
        rm -rf "/tmp/dash-$backend"
        timeout 300 .gpu/bin/burnlens dashboards --backend "$backend" --model "$model" --sae "/tmp/sae-$backend/sae" --data random --seq-len 128 \
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
    local model=$1 backends=$2 out=$3 tokens=${GRAPH_TOKENS:-512} tc=/tmp/tc24k
    timeout 120 python3 - "$tc" <<'EOF'
import math, os, sys, torch
from safetensors.torch import save_file
out, d, f = sys.argv[1], 768, 24576
os.makedirs(out, exist_ok=True)
g = torch.Generator().manual_seed(7)
for i in range(12):
    save_file({"W_enc": torch.randn(f, d, generator=g) / math.sqrt(d), "b_enc": torch.full((f,), -2.88),
               "W_dec": torch.randn(f, d, generator=g) * 0.05, "b_dec": torch.zeros(d)}, os.path.join(out, f"layer_{i}.safetensors"))
open(os.path.join(out, "config.yaml"), "w").write("model_kind: transcoder_set\nfeature_input_hook: ln2.hook_normalized\nfeature_output_hook: hook_mlp_out\n")
EOF
    local ids
    ids=$(python3 -c "import random; r = random.Random(1234); print(','.join(['50256'] + [str(r.randrange(50256)) for _ in range($tokens - 1)]))")
    echo "| graph, $tokens tokens | backend | attribution |"
    echo "|---|---|---|"
    for backend in $backends flex; do
        timeout 400 .gpu/bin/burnlens graph --backend "$backend" --model "$model" --transcoders "$tc" --ids "$ids" --batch-size 64 \
            --max-feature-nodes 512 --out "/tmp/graph-$backend" >"$out/graph-$backend.log" 2>&1
        echo "| | $backend | $(grep -oE "attributed in [0-9.]+ s" "$out/graph-$backend.log" || echo failed) |"
    done
}

sae_rows() {
    local model=$1 backends=$2 out=$3 steps=${SAE_STEPS:-20}
    echo "| SAE step | burnlens backend | burnlens s / step | PyTorch s / step | burnlens / PyTorch |"
    echo "|---|---|---|---|---|"
    for arch in topk standard; do
        local peer
        peer=$(timeout 240 python3 scripts/peer_sae_step.py "$model" $arch $steps 24576 32 6 cuda 2>/dev/null | tail -1)
        echo "$peer" >>"$out/sae.jsonl"
        for backend in $backends; do
            rm -rf "/tmp/sae-$backend"
            timeout 240 .gpu/bin/burnlens train-sae --backend "$backend" --model "$model" --hook blocks.6.hook_resid_pre --architecture $arch \
                --k 32 --d-sae 24576 --steps $steps --batch 32 --seq-len 128 --n-batches-in-buffer 2 --data random --checkpoint-every 100000 \
                $([ $arch = standard ] && echo --l1 1) --out "/tmp/sae-$backend" >"$out/sae-$arch-$backend.log" 2>&1
            python3 - "/tmp/sae-$backend/metrics.jsonl" "$peer" $arch $backend <<'EOF'
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
        done
    done
}

case "${1:-}" in
    pack) pack ;;
    run) run ;;
    *) echo "usage: scripts/device_check.sh pack|run" >&2; exit 2 ;;
esac
