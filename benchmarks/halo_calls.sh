#!/usr/bin/env bash
# The halo and context table of docs/fidelity.md ("Halo") on nvidia-h200, as device calls that each fit the
# 10-minute limit. Run from the project root on the device, with the staged site carried (.gpu-site.tar.xz):
#
#   bash benchmarks/halo_calls.sh ltx        # halo: LTX-2, LTX-2.3 (1080p, bf16), LTX-Video (704p, bf16)
#   bash benchmarks/halo_calls.sh context    # context: LTX-2, LTX-2.3 (241 frames, 704p, bf16); LTX-2 halo fp32
#   bash benchmarks/halo_calls.sh others     # halo: Wan 2.1, HunyuanVideo (480p, bf16)
#   bash benchmarks/halo_calls.sh diffusion  # halo: the LTX-2.5 diffusion decoder (704p, bf16)
#   bash benchmarks/halo_calls.sh floors     # bf16's own distance from float32 where a halo plateaus
#   bash benchmarks/halo_calls.sh wholeframe # halo with the whole-frame pass: Wan 2.1 (720p), HunyuanVideo
#   bash benchmarks/halo_calls.sh rounds     # HunyuanVideo (480p, bf16) with its GroupNorm statistics rounds
#
# Each step writes its log and JSON under $OUT (the device's result folder) with a timeout of its own.
set -uo pipefail
case "${1:-}" in
ltx | context | others | diffusion | floors | wholeframe | rounds) ;;
*) echo "usage: bash benchmarks/halo_calls.sh ltx|context|others|diffusion|floors|wholeframe|rounds" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/halo-out}
mkdir -p "$OUT"
tar -xJf .gpu-site.tar.xz -C /tmp && export PYTHONPATH=/tmp/gpu-site:$PWD || exit 1
nvidia-smi --query-gpu=index,name --format=csv > "$OUT/gpus.txt"

step() {  # step NAME SECONDS ARGS...: measure_halo.py with a limit, log and JSON under $OUT
    local name=$1 limit=$2
    shift 2
    echo "== $name $(date -u +%T)" >> "$OUT/index.txt"
    timeout "$limit" python benchmarks/measure_halo.py "$@" --device cuda --out-json "$OUT/$name.json" \
        > "$OUT/$name.log" 2>&1
    echo "rc $?" >> "$OUT/$name.log"
}

case "$1" in
ltx)
    step halo-ltx2-bf16 100 halo --decoder ltx2 --dtype bfloat16 --shape 16,34,60 --halos 4,6,8,10,12
    step halo-ltx23-bf16 100 halo --decoder ltx2.3 --dtype bfloat16 --shape 16,34,60 --halos 4,6,8,10,12
    step halo-ltxv-bf16 80 halo --decoder ltxv --dtype bfloat16 --shape 16,22,38 --halos 2,4,6,8,10
    ;;
context)  # 31 latent frames (241 frames): two temporal tiles that do not both decode the whole shot
    step context-ltx2-bf16 120 context --decoder ltx2 --dtype bfloat16 --shape 31,22,38 --contexts 6,8,9,10,12,14
    step context-ltx23-bf16 120 context --decoder ltx2.3 --dtype bfloat16 --shape 31,22,38 --contexts 6,8,10,12,14
    step halo-ltx2-fp32 120 halo --decoder ltx2 --dtype float32 --shape 16,22,38 --halos 8,10,12
    ;;
others)
    step halo-wan-bf16 150 halo --decoder wan --dtype bfloat16 --shape 21,60,104 --halos 4,8,12,16
    step halo-hunyuan-bf16 150 halo --decoder hunyuanvideo --dtype bfloat16 --shape 16,60,104 --halos 4,8,16
    ;;
diffusion)
    step halo-diffusion-bf16 250 halo --decoder ltx2-diffusion --dtype bfloat16 --shape 5,22,38 --halos 2,4,6,8,10
    ;;
floors)  # where a halo plateaus: how far the dtype itself is from float32 (the floor it can reach)
    step floor-ltxv-bf16 100 halo --decoder ltxv --dtype bfloat16 --shape 16,22,38 --halos 12,14 --dtype-noise
    step floor-wan-bf16 100 halo --decoder wan --dtype bfloat16 --shape 21,60,104 --halos 8 --dtype-noise
    step floor-ltx23-bf16 100 halo --decoder ltx2.3 --dtype bfloat16 --shape 16,34,60 --halos 12 --dtype-noise
    ;;
wholeframe)  # tiles decode from the mid block run once over the whole frame (`--whole-frame`)
    step wf-wan-bf16 280 halo --decoder wan --dtype bfloat16 --shape 21,90,160 --halos 4,8,12 --whole-frame --dtype-noise
    step wf-hunyuan-bf16 280 halo --decoder hunyuanvideo --dtype bfloat16 --shape 16,60,104 --halos 8,12 --whole-frame
    ;;
rounds)  # tiles from the shared mid block with the whole shot's GroupNorm statistics, one round per GroupNorm
    echo "== rounds-hunyuan-bf16 $(date -u +%T)" >> "$OUT/index.txt"
    timeout 500 python benchmarks/measure_groupnorm_rounds.py --decoder hunyuanvideo --dtype bfloat16 \
        --device cuda --shape 16,60,104 --halos 8,12 --out-json "$OUT/rounds-hunyuan-bf16.json" \
        > "$OUT/rounds-hunyuan-bf16.log" 2>&1
    echo "rc $?" >> "$OUT/rounds-hunyuan-bf16.log"
    ;;
esac
