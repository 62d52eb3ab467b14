#!/usr/bin/env bash
# Fuzz the parsers and importers with cargo-fuzz (libFuzzer), each target for a bounded time.
# Not part of CI. Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 120)
#
# cargo-fuzz needs nightly-only compiler flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain
# accept them. Crashes land in fuzz/artifacts/<target>/; each fixed one becomes a test in
# tests/fuzz_regressions.rs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
secs="${1:-120}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1

# Seed corpora: real configs and checkpoints shaped like the targets' tiny GPT-2.
cd "$root/fuzz"
mkdir -p corpus/config_json corpus/run_config_toml corpus/import_safetensors corpus/import_pytorch logs
for d in "$root"/tests/fixtures/*/; do
  cp "$d/config.json" "corpus/config_json/$(basename "$d").json"
done
cp "$root"/configs/*.toml corpus/run_config_toml/
if [ ! -s corpus/import_safetensors/seed ] || [ ! -s corpus/import_pytorch/seed ]; then
  py="$(cd "$root" && cargo xtask venv)"
  "$py" - "$root/fuzz/corpus" <<'PY'
import os, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
from safetensors.torch import save_file
out = sys.argv[1]
torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2))
sd = {k: v.contiguous() for k, v in m.state_dict().items() if k != "lm_head.weight"}
save_file(sd, os.path.join(out, "import_safetensors", "seed"), metadata={"format": "pt"})
torch.save(sd, os.path.join(out, "import_pytorch", "seed"))
PY
fi

for t in config_json run_config_toml import_safetensors import_pytorch; do
  echo "== $t ($secs s)"
  cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=4096 -print_final_stats=1 \
    2>&1 | tee "logs/$t.log" | grep -E 'stat::number_of_executed_units|stat::new_units_added|ERROR|panicked|SUMMARY' || true
done
echo "crashes (if any):"
find artifacts -type f 2>/dev/null || true
