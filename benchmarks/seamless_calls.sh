#!/usr/bin/env bash
# The seamless-tile rows of docs/fidelity.md on nvidia-h200: a shot rendered with --gpu-memory against the same
# shot untiled (benchmarks/bench_seamless.py), as device calls that fit the 10-minute limit. From the project
# root on the device, with the staged site carried (.gpu-site.tar.xz):
#
#   bash benchmarks/seamless_calls.sh ltx2   # LTX-2 121x1088x1920 at 24 GiB, 121x2176x3840 at 48 GiB
#   bash benchmarks/seamless_calls.sh ltx23  # LTX-2.3 121x1088x1920 at 24 GiB
#   bash benchmarks/seamless_calls.sh diffusion  # the LTX-2.5 diffusion decoder 121x1088x1920 at 24 GiB
set -uo pipefail
case "${1:-}" in ltx2 | ltx23 | diffusion) ;; *) echo "usage: bash benchmarks/seamless_calls.sh ltx2|ltx23|diffusion" >&2; exit 2 ;; esac
OUT=${OUT:-/tmp/seamless-out}
mkdir -p "$OUT"
tar -xJf .gpu-site.tar.xz -C /tmp && export PYTHONPATH=/tmp/gpu-site:$PWD || exit 1

step() {  # step NAME SECONDS ARGS...: bench_seamless.py with a limit, log and JSON under $OUT
    local name=$1 limit=$2
    shift 2
    echo "== $name $(date -u +%T)" >> "$OUT/index.txt"
    timeout "$limit" python benchmarks/bench_seamless.py "$@" --out-json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
    echo "rc $?" >> "$OUT/$name.log"
}

case "$1" in
ltx2)
    step ltx2-1080p-24g 250 --decoder ltx2 --frames 121 --height 1088 --width 1920 --gpu-memory 24GiB
    step ltx2-4k-48g 330 --decoder ltx2 --frames 121 --height 2176 --width 3840 --gpu-memory 48GiB --timeout 300
    ;;
ltx23)
    step ltx23-1080p-24g 300 --decoder ltx2.3 --frames 121 --height 1088 --width 1920 --gpu-memory 24GiB
    ;;
diffusion)
    step diffusion-1080p-24g 330 --decoder ltx2-diffusion --frames 121 --height 1088 --width 1920 \
        --gpu-memory 24GiB --timeout 300
    ;;
esac
