#!/usr/bin/env bash
# The two-GPU rows of docs/performance.md on nvidia-h200-x2, as device calls that each fit the 10-minute limit.
# Run from the project root on the device, with the staged site carried (.gpu-site.tar.xz):
#
#   bash benchmarks/x2_calls.sh one      # one shot, 1 and 2 GPUs, both sizes, explicit grids and auto
#   bash benchmarks/x2_calls.sh batch    # 32 shots compiled: Zarr, H.264 ultrafast and veryfast, 1 and 2 GPUs,
#                                       # beside the plain decode, Zarr and encode ceilings of the same call
#
# Each writes its logs and JSON under $OUT (the device's result folder) and gives every step a timeout, so
# a call returns what it has. Copy the figures kept into docs/performance.md ("Two GPUs and the output path").
set -uo pipefail
case "${1:-}" in one | batch) ;; *) echo "usage: bash benchmarks/x2_calls.sh one|batch" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/x2-out}
mkdir -p "$OUT"
tar -xJf .gpu-site.tar.xz -C /tmp && export PYTHONPATH=/tmp/gpu-site:$PWD || exit 1
cd benchmarks || exit 1
nvidia-smi --query-gpu=index,name --format=csv > "$OUT/gpus.txt"

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, note its exit status
    local name=$1 limit=$2
    shift 2
    echo "== $name $(date -u +%T)" >> "$OUT/index.txt"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "rc $?" >> "$OUT/$name.log"
}

x3() { for _ in 1 2 3; do printf '%s ' "$@"; done; }  # a case three times (the first is checked, left out)

case "${1:-}" in
one)
    # 1 GPU: the whole tile in carried chunks (the best grid there); 2 GPUs: two tiles, and auto
    # shellcheck disable=SC2046
    step one-704 280 python benchmark_output.py --parts plain,farm --shots 0 --reps 5 \
        --one-sizes 704x1216 --one-cases $(x3 1,1,1,5c,8) $(x3 1,1,2,5c,8) $(x3 0,0,0,0,8) \
        --gpu-counts 1,2 --clusters daemon --checks-once --frames-hash --out-json "$OUT/one-704.json"
    # shellcheck disable=SC2046
    step one-1080 300 python benchmark_output.py --parts plain,farm --shots 0 --reps 5 --height 1088 --width 1920 \
        --one-sizes 1088x1920 --one-cases $(x3 1,1,1,5c,8) $(x3 1,1,2,5c,8) $(x3 0,0,0,0,8) \
        --gpu-counts 1,2 --clusters daemon --checks-once --frames-hash --out-json "$OUT/one-1080.json"
    ;;
batch)
    step batch 580 python benchmark_output.py --parts plain,zarr,encode,farm --shots 32 --compile \
        --gpu-counts 1,2 --batch-outputs zarr ultrafast veryfast --procs 8,16 --encode-zarr \
        --presets ultrafast veryfast --out-json "$OUT/batch.json"
    ;;
esac
grep -h "rc " "$OUT"/*.log
