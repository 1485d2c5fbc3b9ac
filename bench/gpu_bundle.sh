#!/usr/bin/env bash
# Makes the offline bundle for bench/gpu_battery.sh small enough to travel to a GPU host: runs
# ../shared/gpu/bundle.sh (Deno, the npm cache, the Vulkan loader into the git-ignored .gpu/), then
# caches the npm packages again from what the battery runs only (main.ts, bench/, tools/ and the
# test files that import no client SDK, as the battery's test stage picks them), without the
# transpile cache (gen/) and the SQLite journals. On 2026-11-27 bundle.sh alone wrote 199 MB (every
# test file's imports, the client SDKs included); this leaves ~46 MB, under the device tool's 64 MiB
# for the working tree and what is carried.
#
#   bash bench/gpu_bundle.sh      # in the project root; then carry .gpu to the GPU host
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
log=$(mktemp)
bash ../shared/gpu/bundle.sh > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
deno_bin=$(npx -y deno@2.9.6 eval 'console.log(Deno.execPath())')
rm -rf .gpu/deno_dir
tests=$(grep -L "npm:openai\|@langchain\|npm:ai\|ai-sdk\|kubernetes-models" tests/*_test.ts)
# shellcheck disable=SC2086
DENO_DIR=$root/.gpu/deno_dir "$deno_bin" cache --no-lock main.ts bench/*.ts tools/*.ts $tests \
  > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
rm -f "$log"
rm -rf .gpu/deno_dir/gen .gpu/deno_dir/*-wal .gpu/deno_dir/*-shm
echo "bundle: $(du -sb .gpu | cut -f1) bytes in .gpu; the tree: $(git ls-files -z | xargs -0 cat | wc -c) bytes"
