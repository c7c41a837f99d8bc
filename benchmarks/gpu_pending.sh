#!/usr/bin/env bash
# The GPU figures docs/fidelity.md, docs/decoders.md and docs/performance.md mark "pending a GPU", as three
# device calls on nvidia-h200 that each end inside 8 minutes (CALL_BUDGET_S). Run from the project root on
# the device, with the staged site carried (.gpu-site.tar.xz):
#
#   bash benchmarks/gpu_pending.sh call1  # LTX-2.5 diffusion decoder and LTX-2 1080p through `farm render
#                                         # --gpu-memory 24GiB`; halo with the whole-frame pass: Wan 2.1 720p (bf16);
#                                         # MiniMax-H3 and Cosmos decode beside diffusers; HunyuanVideo 480p
#                                         # halo with the whole-frame pass (bf16)
#   bash benchmarks/gpu_pending.sh call2  # the halo of cogvideox, mochi, hunyuanvideo15, cosmos, minimax-h3 (bf16,
#                                         # released configs); cogvideox, mochi, hunyuanvideo15 decode beside diffusers;
#                                         # HunyuanVideo's statistics rounds (bf16, float32, beside vae.decode), its
#                                         # 1x2x2 render, the bits of a tile and of a crop
#   bash benchmarks/gpu_pending.sh call3  # cold start: `farm render` beside the plain script, alternated 5x each;
#                                         # the tests that need a GPU (pytest staged: EXTRA="pytest hypothesis …");
#                                         # the temporal context of hunyuanvideo15, cosmos, cogvideox, mochi (bf16)
#   bash benchmarks/gpu_pending.sh cpu [call1|call2|call3]   # the same steps with tiny configs on a CPU
#   bash benchmarks/gpu_pending.sh call2 --dry-run           # (the same as `cpu call2`)
#
# Every step runs under `timeout`, clipped to what is left of the call's budget (a step with less than
# MIN_STEP_S left is skipped and says so), and writes its log and JSON into one folder per call; after
# each step that folder is packed into $OUT/<call>.tar.gz and its index copied to $OUT/<call>-index.txt
# (two files a call: the device returns at most 8). STEPS=name,name runs only those steps (a skipped one
# again, say). Read the results with `python benchmarks/fold_gpu_results.py DEVICE_FILES/*.tar.gz`.
#
# Environment: OUT (default /tmp/gpu-pending-out), RESULTS (the unpacked folders, default /tmp/gpu-pending),
# SCRATCH (renders, weights; default /tmp/gpu-pending-work), CALL_BUDGET_S (480), MIN_STEP_S (30),
# PYTHON (the interpreter; on the device `python` with the unpacked site), CPU_STEP_S (a CPU step's
# limit, 900).
set -uo pipefail
usage() { echo "usage: bash benchmarks/gpu_pending.sh call1|call2|call3 [--dry-run] | cpu [call1|call2|call3]" >&2; exit 2; }

dry=0
calls=()
for arg in "$@"; do
    case "$arg" in
    call1 | call2 | call3) calls+=("$arg") ;;
    cpu | --dry-run) dry=1 ;;
    *) usage ;;
    esac
done
if [ ${#calls[@]} -eq 0 ]; then
    [ "$dry" = 1 ] || usage
    calls=(call1 call2 call3)
fi

OUT=${OUT:-/tmp/gpu-pending-out}
RESULTS=${RESULTS:-/tmp/gpu-pending}
SCRATCH=${SCRATCH:-/tmp/gpu-pending-work}
MIN_STEP_S=${MIN_STEP_S:-30}
mkdir -p "$OUT" "$RESULTS" "$SCRATCH"
if [ "$dry" = 1 ]; then
    PY=${PYTHON:-python}
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
    DEV=cpu
    BUDGET=${CALL_BUDGET_S:-100000}  # a CPU check is not held to the device's limit
else
    PY=${PYTHON:-python}
    tar -xJf .gpu-site.tar.xz -C /tmp && export PYTHONPATH=/tmp/gpu-site:$PWD || exit 1
    DEV=cuda
    BUDGET=${CALL_BUDGET_S:-480}
fi

sz() { if [ "$dry" = 1 ]; then echo "$2"; else echo "$1"; fi; }  # sz GPU_VALUE CPU_VALUE

# GIB NAME: whether the GPU has GIB GiB (always on a CPU check); else the step NAME (if named) is skipped, said
# in the index (HunyuanVideo 1.5's untiled references of 61 frames and more ran out of an H100's 80 GB)
has_gib() {
    local need=$1 name=$2 total
    [ "$dry" = 1 ] && return 0
    total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    if [ -n "$total" ] && [ "$total" -ge $((need * 1024)) ]; then return 0; fi
    [ -z "$name" ] && return 1  # a question only: nothing skipped
    if [ -z "${STEPS:-}" ] || [[ ",$STEPS," == *",$name,"* ]]; then
        echo "== $name skipped: needs a GPU of ${need} GiB (this one: ${total:-?} MiB)" >> "$RES/index.txt"
    fi
    return 1
}

pack() {  # the call's folder into $OUT (two files)
    tar -czf "$OUT/$call.tar.gz" -C "$RESULTS" "$call"
    cp "$RES/index.txt" "$OUT/$call-index.txt"
}

step() {  # step NAME SECONDS COMMAND...: run with a limit (clipped to the call's budget), log into $RES
    local name=$1 limit=$2 left started rc
    shift 2
    if [ -n "${STEPS:-}" ] && [[ ",$STEPS," != *",$name,"* ]]; then return 0; fi
    [ "$dry" = 1 ] && limit=${CPU_STEP_S:-900}
    left=$((BUDGET - (SECONDS - call_started) - 15))
    if [ "$left" -lt "$MIN_STEP_S" ]; then
        echo "== $name skipped: ${left} s left of the call's ${BUDGET} s" >> "$RES/index.txt"
        pack
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name $(date -u +%T), limit ${limit} s: $*" >> "$RES/index.txt"
    started=$SECONDS
    timeout -k 10 "$limit" "$@" > "$RES/$name.log" 2>&1
    rc=$?
    echo "rc $rc" >> "$RES/$name.log"
    echo "   $name: rc $rc, $((SECONDS - started)) s" >> "$RES/index.txt"
    pack
}

halo() {  # halo NAME SECONDS ARGS...: measure_halo.py, its JSON beside its log
    local name=$1 limit=$2
    shift 2
    step "$name" "$limit" "$PY" benchmarks/measure_halo.py "$@" --device "$DEV" --out-json "$RES/$name.json"
}

decode() {  # decode NAME SECONDS DECODER SHAPE: bench_family_decode.py (bf16 on the GPU, float32 on a CPU)
    local name=$1 limit=$2
    step "$name" "$limit" "$PY" benchmarks/bench_family_decode.py --decoder "$3" --shape "$4" \
        --dtype "$(sz bfloat16 float32)" --device "$DEV" --reps "$(sz 3 1)" --out-json "$RES/$name.json"
}

# NAME SECONDS DECODER FRAMES HEIGHT WIDTH BUDGET: bench_seamless.py, a shot through `farm render --gpu-memory
# BUDGET` (the planner's tiles; 1x2x2 on a CPU) beside the same shot untiled
seamless() {
    local name=$1 limit=$2
    step "$name" "$limit" "$PY" benchmarks/bench_seamless.py --decoder "$3" --dtype "$BF" --frames "$4" \
        --height "$5" --width "$6" --gpu-memory "$7" --tiles "$(sz auto 1,2,2)" \
        --timeout "$(sz $((limit - 20)) 600)" --work "$SCRATCH/seamless" --out-json "$RES/$name.json"
    rm -rf "$SCRATCH/seamless"
}

BF=$(sz bfloat16 float32)
call_started=0  # the first call's budget counts from the script's start (the site's unpacking included)
for call in "${calls[@]}"; do
    RES=$RESULTS/$call
    rm -rf "$RES"
    mkdir -p "$RES"
    echo "# $call on $DEV, $(date -u +%FT%TZ), budget ${BUDGET} s, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" > "$RES/index.txt"
    { nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>/dev/null || echo "no GPU"; } > "$RES/gpus.txt"
    # Estimates on an H200 (bf16; benchmarks/README.md says what they rest on): decode seconds from the
    # decoders' FLOPs at the 130-150 TFLOP/s that Wan and HunyuanVideo decodes reached there, plus process
    # start and random weights built on the CPU, float32 (--dtype-noise) budgeted at 4x bf16's time;
    # renders as seamless_calls.sh's steps took.
    case "$call" in
    call1)
        # ~60 s, on a GPU only: what LTX-2.3's 1080p tile (the 24GiB plan's) loads beside torch's allocator in its
        # first decode, after the budget's cap was set (its render peaked 0.08 GiB over the budget)
        [ "$dry" = 1 ] || step outside-ltx23-tile 90 "$PY" benchmarks/diagnose_gpu.py peaks --decoder ltx2.3 \
            --init-on-device --shapes 16,34,42 16,34,42
        # ~200 s: synth, plan, two renders of 121x1088x1920 (the decoder about 10 s a decode), frames compared
        seamless seamless-diffusion-1080p 300 "$(sz ltx2-diffusion ltx2-diffusion-tiny)" "$(sz 121 17)" \
            "$(sz 1088 192)" "$(sz 1920 256)" "$(sz 24GiB 1GiB)"
        # ~150 s each: LTX-2's and LTX-2.3's 1080p rows again, for the seam band and worst pixel on the float16
        # frames as written
        seamless seamless-ltx2-1080p 250 "$(sz ltx2 ltx2-tiny)" "$(sz 121 17)" "$(sz 1088 192)" "$(sz 1920 256)" \
            "$(sz 24GiB 1GiB)"
        seamless seamless-ltx23-1080p 250 "$(sz ltx2.3 ltx2.3-tiny)" "$(sz 121 17)" "$(sz 1088 192)" \
            "$(sz 1920 256)" "$(sz 24GiB 1GiB)"
        # ~120 s: Wan 2.1 at 720p (its mid block run whole, halo 8)
        seamless seamless-wan-720p 200 "$(sz wan wan-tiny)" "$(sz 81 9)" "$(sz 720 192)" "$(sz 1280 256)" \
            "$(sz 24GiB 1GiB)"
        # ~190 s, on a GPU of 120 GiB or more (the untiled reference): LTX-2 4K at --gpu-memory 48GiB, its seam
        # band on the float16 frames and its peak under the allocator's cap
        has_gib 120 seamless-ltx2-4k && seamless seamless-ltx2-4k 300 "$(sz ltx2 ltx2-tiny)" "$(sz 121 17)" \
            "$(sz 2176 256)" "$(sz 3840 384)" "$(sz 48GiB 2GiB)"
        # ~100 s: the diffusion decoder's 1080p tiles decoding from its first two stages run over the whole frame
        halo halo-diffusion-wf-1080p 160 halo --decoder "$(sz ltx2-diffusion ltx2-diffusion-tiny)" --dtype "$BF" \
            --shape "$(sz 5,34,60 3,16,16)" --halos "$(sz 8,10 1)" --whole-frame
        # ~90 s: the diffusion decoder's tiles and its whole bf16 decode, each measured from a float32 decode
        halo halo-diffusion-noise 150 halo --decoder "$(sz ltx2-diffusion ltx2-diffusion-tiny)" --dtype "$BF" \
            --shape "$(sz 5,22,38 3,16,16)" --halos "$(sz 8,12 2)" --dtype-noise
        # ~70 s: the same shot in float32 (TF32 off), tiles against the whole decode: the halo's own reach
        halo halo-diffusion-f32 120 halo --decoder "$(sz ltx2-diffusion ltx2-diffusion-tiny)" --dtype float32 \
            --shape "$(sz 5,22,38 3,16,16)" --halos "$(sz 8,12 2)"
        # ~110 s: whole decode 640 TFLOP (~5 s), float32 whole, 3 halos at 1.3-1.8x
        halo wf-wan-720p-bf16 200 halo --decoder "$(sz wan wan-tiny)" --dtype "$BF" --shape "$(sz 21,90,160 3,24,24)" \
            --halos "$(sz 4,8,12 4,8)" --whole-frame --dtype-noise
        # ~60 s: a 36-layer ViT built on the CPU; 22x720x1280 on its own 256-px tiles
        decode decode-minimax-h3 120 "$(sz minimax-h3 minimax-h3-tiny)" "$(sz 7,45,80 7,16,16)"
        # ~30 s: 121x704x1280 (Cosmos 1.0's), 61 TFLOP
        decode decode-cosmos 60 "$(sz cosmos cosmos-tiny)" "$(sz 16,88,160 3,8,8)"
        # ~50 s: whole decode 590 TFLOP (~4 s), 2 halos; last, since HunyuanVideo's bf16 halo sweep at this
        # shape has decoded to NaN on an H200 before (fold_gpu_results.py lists such rows, folds none)
        halo wf-hunyuan-480p-bf16 120 halo --decoder "$(sz hunyuanvideo hunyuanvideo-tiny)" --dtype "$BF" \
            --shape "$(sz 16,60,104 3,24,24)" --halos "$(sz 8,12 4,6)" --whole-frame
        ;;
    call2)
        # halos, 1x2x2 tiles, no overlap: whole decode + each halo's tiles (1.2-2.6x the whole)
        halo halo-cogvideox-bf16 90 halo --decoder "$(sz cogvideox cogvideox-tiny)" --dtype "$BF" \
            --shape "$(sz 13,60,90 3,24,24)" --halos "$(sz 4,8,12,16 4,8)"  # ~45 s: 49x480x720, 315 TFLOP
        # ~80 s: 61x480x832, 610 TFLOP; under 100 GiB (an H100) 29 frames, whose float32 decode fits
        hv15_frames=$(if has_gib 100 ""; then echo 16; else echo 8; fi)
        halo halo-hunyuanvideo15-bf16 120 halo --decoder "$(sz hunyuanvideo15 hunyuanvideo15-tiny)" --dtype "$BF" \
            --shape "$(sz "$hv15_frames",30,52 3,16,16)" --halos "$(sz 4,6,8,12 4,6)" --dtype-noise
        halo halo-mochi-bf16 90 halo --decoder "$(sz mochi mochi-tiny)" --dtype "$BF" \
            --shape "$(sz 7,60,106 3,24,24)" --halos "$(sz 4,8,12,16 4,8)"  # ~40 s: 37x480x848, 270 TFLOP
        halo halo-cosmos-bf16 60 halo --decoder "$(sz cosmos cosmos-tiny)" --dtype "$BF" \
            --shape "$(sz 8,60,104 3,32,32)" --halos "$(sz 2,4,6,8,12 8,12)" --dtype-noise  # ~30 s: 13 TFLOP
        halo halo-minimax-h3-bf16 120 halo --decoder "$(sz minimax-h3 minimax-h3-tiny)" --dtype "$BF" \
            --shape "$(sz 7,45,80 7,40,44)" --halos "$(sz 0,4,8,12 0,8)"  # ~60 s
        # decode beside diffusers: one untimed call, then 3 alternated timed calls a side
        decode decode-cogvideox 75 "$(sz cogvideox cogvideox-tiny)" "$(sz 13,60,90 5,8,8)"  # ~35 s: 49x480x720
        decode decode-mochi 75 "$(sz mochi mochi-tiny)" "$(sz 14,60,106 3,8,8)"  # ~40 s: 79x480x848, 540 TFLOP
        has_gib 100 decode-hunyuanvideo15 && decode decode-hunyuanvideo15 150 "$(sz hunyuanvideo15 hunyuanvideo15-tiny)" "$(sz 31,30,53 3,8,8)"  # ~90 s: 121x480x848, 1240 TFLOP
        # last (HunyuanVideo has decoded to NaN in bf16 here before): its tiles with the whole shot's GroupNorm
        # statistics, one round per GroupNorm (the same as `halo_calls.sh rounds`); ~100 s: 61x480x832, 2 halos
        step rounds-hunyuan-bf16 150 "$PY" benchmarks/measure_groupnorm_rounds.py --decoder "$(sz hunyuanvideo hunyuanvideo-tiny)" \
            --dtype "$BF" --device "$DEV" --shape "$(sz 16,60,104 3,24,24)" --halos "$(sz 8,12 6,8)" \
            --out-json "$RES/rounds-hunyuan-bf16.json"
        # ~70 s: the same tiles and the untiled decode, each measured from a float32 decode, beside diffusers'
        # own vae.decode (17 frames: the float32 decode of 61 needs about twice the bf16 one's 59 GiB)
        step rounds-hunyuan-noise 180 "$PY" benchmarks/measure_groupnorm_rounds.py --decoder "$(sz hunyuanvideo hunyuanvideo-tiny)" \
            --dtype "$BF" --device "$DEV" --shape "$(sz 5,60,104 3,24,24)" --halos "$(sz 8,12,16 8)" --dtype-noise \
            --against-diffusers --out-json "$RES/rounds-hunyuan-noise.json"
        # ~40 s: the same tiles and rounds in float32 (TF32 off) against the float32 decode: the tiling's own error
        step rounds-hunyuan-f32 90 "$PY" benchmarks/measure_groupnorm_rounds.py --decoder "$(sz hunyuanvideo hunyuanvideo-tiny)" \
            --dtype float32 --device "$DEV" --shape "$(sz 5,60,104 3,24,24)" --halos "$(sz 8,12 8)" \
            --out-json "$RES/rounds-hunyuan-f32.json"
        # ~50 s: a 1x2x2 render of 33x480x832 through `farm render` (the rounds, no blend) beside the same shot
        # untiled (one worker carries the four tiles between rounds: 48 GiB)
        step seamless-hunyuan-480p 150 "$PY" benchmarks/bench_seamless.py --decoder "$(sz hunyuanvideo hunyuanvideo-tiny)" \
            --dtype "$BF" --frames "$(sz 33 9)" --height "$(sz 480 128)" --width "$(sz 832 128)" \
            --gpu-memory "$(sz 48GiB 2GiB)" --tiles 1,2,2 --timeout 130 --work "$SCRATCH/seamless" \
            --out-json "$RES/seamless-hunyuan-480p.json"
        rm -rf "$SCRATCH/seamless"
        # ~30 s: where a tile's bits part from the untiled decode's, every module of the rounds compared
        [ "$dry" = 1 ] || step tile-bits-hunyuan 60 "$PY" benchmarks/diagnose_gpu.py tile-bits --decoder hunyuanvideo \
            --shape 5,60,104 --halo 16
        # ~20 s: which bf16 operations give a crop the whole's bits (convolution, linear, the attention kernel)
        [ "$dry" = 1 ] || step crop-bits 60 "$PY" benchmarks/diagnose_gpu.py crop-bits
        ;;
    call3)
        # ~140 s: LTX-2 weights saved (39 s); a GPU worker's decoder build step by step (the server's imports,
        # CUDA context, class import, meta build, weights read), twice each way, under -X importtime
        step cold-profile 200 "$PY" benchmarks/bench_real_path.py --out "$SCRATCH/profile" --parts profile --reps 2 \
            --batch 0 --decoder "$(sz ltx2 ltx2-tiny)" --frames "$(sz 121 17)" --height "$(sz 704 128)" \
            --width "$(sz 1216 192)" --device "$DEV"
        mkdir -p "$RES/profile"
        cp "$SCRATCH"/profile/real_path.json "$RES/profile/" 2>/dev/null
        cp -r "$SCRATCH"/profile/logs "$RES/profile/" 2>/dev/null
        rm -rf "$SCRATCH/profile"
        pack
        # ~320 s: LTX-2 weights (4.6 GB) saved (39 s) and a 704p shot synthesised, then 5 cold one-shot runs of
        # each side, alternated (21-31 s a run; --spawned-too adds Dask's spawned workers, 31-35 s a run)
        step cold-start 420 "$PY" benchmarks/bench_real_path.py --out "$SCRATCH/real-path" --parts one --reps 5 \
            --batch 0 --decoder "$(sz ltx2 ltx2-tiny)" --frames "$(sz 121 17)" --height "$(sz 704 128)" \
            --width "$(sz 1216 192)" --device "$DEV"
        mkdir -p "$RES/real-path"
        cp "$SCRATCH"/real-path/real_path.json "$SCRATCH"/real-path/real_path.md "$RES/real-path/" 2>/dev/null
        cp -r "$SCRATCH"/real-path/logs "$RES/real-path/" 2>/dev/null
        rm -rf "$SCRATCH/real-path"
        pack
        # the tests that need a GPU (skipped on CPU machines: CUDA IPC, GPU blends and transport, paced
        # launches, the forkserver's GPU check); needs pytest and hypothesis in the staged site; ~40 s
        step gpu-tests 90 "$PY" -m pytest -q -p no:cacheprovider -rs \
            tests/test_blend.py::test_gpu_blends_on_their_own_stream_give_the_cpus_bytes \
            tests/test_ipc.py tests/test_launch_pacing.py::test_a_paced_decode_waits_and_gives_the_unpaced_frames \
            tests/test_transport.py::test_a_gpu_piece_sent_by_value_after_its_ready_event_arrives_whole \
            tests/test_transport.py::test_side_streams_go_before_the_decode_stream \
            tests/test_worker_forkserver.py::test_the_servers_imports_leave_cuda_to_the_forked_workers
        # temporal context, two temporal tiles, each up to the whole shot; the cheap ones first
        halo context-cosmos-bf16 45 context --decoder "$(sz cosmos cosmos-tiny)" --dtype "$BF" \
            --shape "$(sz 16,60,104 16,4,4)" --contexts "$(sz 4,8,12,15 4,15)"  # ~25 s
        halo context-cogvideox-bf16 45 context --decoder "$(sz cogvideox cogvideox-tiny)" --dtype "$BF" \
            --shape "$(sz 96,4,4 40,4,4)" --contexts "$(sz 8,12,16,20,24,28,32,36,40,44 8,14,20)" --stop  # ~30 s
        halo context-mochi-bf16 45 context --decoder "$(sz mochi mochi-tiny)" --dtype "$BF" \
            --shape "$(sz 96,4,4 40,4,4)" --contexts "$(sz 8,12,16,20,24,28,32,36,40,44 8,12)" --stop  # ~30 s
        # ~80 s: whole decode 1240 TFLOP (~9 s), three contexts at 1.5-2x
        halo context-hunyuanvideo15-bf16 120 context --decoder "$(sz hunyuanvideo15 hunyuanvideo15-tiny)" --dtype "$BF" \
            --shape "$(sz 31,30,52 24,4,4)" --contexts "$(sz 8,14,20 8,14)"
        ;;
    esac
    echo "# $call done in $((SECONDS - call_started)) s" >> "$RES/index.txt"
    pack
    cat "$RES/index.txt"
    call_started=$SECONDS
done
