"""farm on the path users take: weights from files, a fresh `farm` command, beside the plain script.

Every row is a fresh process timed from outside (wall seconds), in one run on one machine:

- the plain diffusers script (`plain_diffusers_decode.py`: imports, ``from_pretrained`` onto the GPU,
  decode, write an mp4) for one shot and for a batch of shots;
- ``farm render`` with its own cluster (cold: everything starts), one shot and the batch;
- ``farm render`` into a running ``farm cluster``: its first render (the decoder loads) and the next
  ones (the decoder is kept);
- with ``--single-file``, the same weights as one original-layout file (``vae.`` prefix);
- the imports each side pays.

farm's rows also keep what ``farm -v render`` logs: its set-up steps and each worker's seconds to its
decoder and first decode. Writes ``real_path.json`` and ``real_path.md`` (a table) under ``--out``.

    python benchmarks/bench_real_path.py --out /tmp/real-path            # LTX-2 architecture, 704p
    python benchmarks/bench_real_path.py --out /tmp/rp --decoder ltx2-tiny --frames 17 --height 128 \\
        --width 192 --batch 0 --parts one --reps 1 --device cpu        # a quick check on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> dict:
    """Run `cmd` to completion (or `timeout`); its wall seconds, exit code and output (logged)."""
    started = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = 124, str(exc.stdout or ""), str(exc.stderr or "")
    wall = time.perf_counter() - started
    log.write_text(f"$ {' '.join(cmd)}\nrc {code}, {wall:.2f} s\n--- stdout\n{out}\n--- stderr\n{err}\n")
    print(f"  {log.stem}: rc {code}, {wall:.2f} s", flush=True)
    return {"wall_s": wall, "rc": code, "stdout": out, "stderr": err}


def farm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "farm", *args]


def farm_figures(stderr: str) -> dict:
    """The figures `farm -v render` logs: the command's start before the render's, graph, set-up and
    finishing seconds, set-up steps, workers, the local cluster's close."""
    figures: dict = {}
    last = re.search(r"in ([\d.]+) s \(\+ ([\d.]+) s set-up, ([\d.]+) s finishing\)", stderr)
    if last:
        figures.update(graph_s=float(last[1]), setup_s=float(last[2]), finish_s=float(last[3]))
    steps = re.search(r"set-up [\d.]+ s: (.*)", stderr)
    if steps:
        figures["setup_steps"] = {
            k.strip(): float(v) for k, v in re.findall(r"([^,]+?) ([\d.]+) s", steps[1])
        }
    workers = {}
    for worker, body in re.findall(r"worker (\S+): (.*)", stderr):
        workers[worker] = {k.strip(): float(v) for k, v in re.findall(r"([^,]+?) ([\d.]+) s", body)}
    if workers:
        figures["workers"] = workers
    before = re.search(r"the command's start \(Python, farm's imports\) ([\d.]+) s", stderr)
    if before:
        figures["before_render_s"] = float(before[1])
    server = re.search(r"the worker forkserver started at ([\d.]+) s", stderr)
    if server:
        figures["forkserver_started_s"] = float(server[1])
    closed = re.search(r"closed the local cluster in ([\d.]+) s", stderr)
    if closed:
        figures["cluster_close_s"] = float(closed[1])
    return figures


def save_weights(decoder: str, folder: Path, single_file: Path | None, log: Path) -> None:
    """The decoder architecture with seeded random weights, saved as diffusers' ``save_pretrained``
    writes it (and, when asked, as one original-layout file), in a child process."""
    code = f"""
import torch
from farm.decoders import FAMILIES
from farm.inputs.synthetic import resolve_decoder
family, name = resolve_decoder({decoder!r})
cls = FAMILIES[family]
torch.manual_seed(0)
model = cls.model_class()(**cls.named_configs[name])
model.save_pretrained({str(folder)!r})
"""
    if single_file is not None:  # LTX-2's full checkpoint: the VAE under "vae.", beside a transformer
        code += f"""
from safetensors.torch import save_file
full = cls._full_config(cls.named_configs[name])
wanted = cls.decoder_tensor_shapes(cls.named_configs[name])
state = {{"vae." + cls.original_name(k, "ltx-original", full): v.contiguous()
         for k, v in model.state_dict().items() if k in wanted}}
state["model.diffusion_model.stand_in.weight"] = torch.zeros(2**28, dtype=torch.bfloat16)  # never read
save_file(state, {str(single_file)!r})
"""
    result = run([sys.executable, "-c", code], log, timeout=600)
    if result["rc"] != 0:
        raise SystemExit(f"saving the weights failed: see {log}")


def export_latents(job: Path, folder: Path) -> list[str]:
    """The job's latents as .npy files, for the plain script."""
    import numpy as np
    import zarr

    folder.mkdir(parents=True, exist_ok=True)
    group = zarr.open_group(str(job), mode="r")
    paths = []
    for name in sorted(group.group_keys()):
        path = folder / f"{name}.npy"
        np.save(path, np.asarray(group[name]["latent"][...]))
        paths.append(str(path))
    return paths


def start_cluster(scheduler_file: Path, log: Path) -> subprocess.Popen:
    ports = ("--port", "0", "--dashboard-port", "0")
    command = farm_cmd("cluster", "--scheduler-file", str(scheduler_file), *ports)
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while not scheduler_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)  # workers join after the file is written
    return proc


# Each prints {"imports": s, "load": s} as JSON: the load from after the imports (the model class's
# included) to the weights on the GPU.
LOAD_DIFFUSERS = """
import json, sys, time
t = time.perf_counter()
import torch, diffusers
model_cls = getattr(diffusers, sys.argv[2])  # the class's own import is an import too
i = time.perf_counter()
vae = model_cls.from_pretrained(sys.argv[1], torch_dtype=torch.bfloat16).to("cuda")
torch.cuda.synchronize()
print(json.dumps({"imports": i - t, "load": time.perf_counter() - i}))
"""
LOAD_FARM = """
import json, sys, time
t = time.perf_counter()
import torch
from farm.decoders import diffusers_vae, decoder_class
from farm.store.job import open_job
spec = open_job(sys.argv[1]).spec
decoder_class(spec).model_class()  # the class's own import is an import too
i = time.perf_counter()
decoder = decoder_class(spec).load(spec, "cuda")
torch.cuda.synchronize()
print(json.dumps({"imports": i - t, "load": time.perf_counter() - i}))
"""
# A GPU worker's decoder build, step by step, as a worker forked from farm's worker forkserver makes it
# (the server's imports, then the CUDA context, then the build), in a fresh process. "farm": the build as
# the worker runs it, its weights read ahead beside it, profiled on the building thread; "split": the
# class's import, the meta build and the read one after the other. Run with ``-X importtime``.
PROFILE_BUILD = """
import cProfile, io, json, pstats, sys, time
t = time.perf_counter()
import torch
from farm.run.forkserver_imports import import_decoder_code
import_decoder_code()
steps = {"server imports": time.perf_counter() - t}
dev = "cuda" if torch.cuda.is_available() else "cpu"  # a CPU run checks the script
t = time.perf_counter()
torch.empty(1, device=dev)
steps["cuda context"] = time.perf_counter() - t
from farm.decoders import decoder_class, diffusers_vae
from farm.decoders import weights as W
from farm.store.job import open_job
spec = open_job(sys.argv[1]).spec
cls = decoder_class(spec)
print("CLASS IMPORT STARTS", file=sys.stderr, flush=True)
if sys.argv[2] == "farm":
    profile = cProfile.Profile()
    t = time.perf_counter()
    profile.enable()
    model = cls.build_from_weights(spec, dev)
    profile.disable()
    torch.cuda.synchronize() if dev == "cuda" else None
    steps["build"] = time.perf_counter() - t
    steps.update(diffusers_vae._build_steps)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(30)
    print(text.getvalue(), file=sys.stderr)
else:
    t = time.perf_counter()
    cls.model_class()
    steps["class import"] = time.perf_counter() - t
    t = time.perf_counter()
    model = cls.meta_model(spec.config)
    steps["meta build"] = time.perf_counter() - t
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    t = time.perf_counter()
    state = W.read_decoder_state(spec, cls, expected, dev, getattr(torch, spec.dtype))
    torch.cuda.synchronize() if dev == "cuda" else None
    steps["weights read alone"] = time.perf_counter() - t
print(json.dumps({k: round(v, 3) for k, v in steps.items()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--decoder", default="ltx2")
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--height", type=int, default=704)
    parser.add_argument("--width", type=int, default=1216)
    parser.add_argument("--batch", type=int, default=32, help="shots of the batch rows (0: none)")
    parser.add_argument("--reps", type=int, default=2, help="cold one-shot rows, alternated with the plain")
    parser.add_argument("--warm-renders", type=int, default=3)
    parser.add_argument("--single-file", action="store_true", help="also the original-layout file")
    parser.add_argument("--model", default="AutoencoderKLLTX2Video")
    parser.add_argument("--plain-dtype", default=None,
                        help="the dtype both sides decode in (the job's and the plain script's; "
                             "default bfloat16, float32 with --device cpu)")
    parser.add_argument("--spawned-too", action="store_true",
                        help="the cold one-shot rows also with Dask's spawned workers (fork-workers off)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=VALUE",
                        help="the cold one-shot rows also with this environment variable set (repeatable: "
                        "one row per variant)")  # fmt: skip
    parser.add_argument("--parts", default="imports,load,one,warm,batch,single",
                        help="rows to run; also 'profile' (a GPU worker's decoder build, step by step)")
    parser.add_argument("--device", default="cuda",
                        help="the plain script's device (cpu, with --parts one: a check of the script on a "
                        "CPU; the load rows need a GPU)")  # fmt: skip
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    out: Path = args.out
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    results: dict = {"decoder": args.decoder, "shape": [args.frames, args.height, args.width], "rows": {}}
    rows = results["rows"]

    def record(name: str, result: dict, farm: bool = False) -> None:
        row = {"wall_s": round(result["wall_s"], 3), "rc": result["rc"]}
        if farm:
            row.update(farm_figures(result["stdout"] + result["stderr"]))
        if not farm and result["rc"] == 0 and result["stdout"].strip().startswith("{"):
            row["steps"] = json.loads(result["stdout"].strip().splitlines()[-1])
        rows[name] = row
        (out / "real_path.json").write_text(json.dumps(results, indent=1))

    if "imports" in parts:
        for name, code in (("import torch", "import torch"),
                           ("import torch + diffusers.models", "import torch, diffusers.models"),
                           ("import farm.run.render", "import farm.run.render"),
                           ("import farm.cli", "import farm.cli")):  # fmt: skip
            record(name, run([sys.executable, "-c", code], logs / f"{name}.log", 120))
        record("farm --version", run(farm_cmd("--version"), logs / "version.log", 60))

    vae, single = work / "vae", work / "vae-original.safetensors"
    save_weights(
        args.decoder, vae, single if args.single_file and "single" in parts else None, logs / "save.log"
    )
    dtype = args.plain_dtype or ("float32" if args.device == "cpu" else "bfloat16")  # both sides decode in it
    shape = ["--frames", str(args.frames), "--height", str(args.height), "--width", str(args.width),
             "--decoder", args.decoder, "--dtype", dtype]  # fmt: skip
    job1 = work / "job1.zarr"
    run(farm_cmd("synth", str(job1), "--weights", str(vae), *shape, "--overwrite"), logs / "synth1.log", 300)
    latents1 = export_latents(job1, work / "latents1")
    plain = [
        sys.executable,
        str(HERE / "plain_diffusers_decode.py"),
        "--vae",
        str(vae),
        "--model",
        args.model,
        "--device",
        args.device,
        "--dtype",
        dtype,
    ]

    if "load" in parts:  # the decoder ready on the GPU: diffusers' from_pretrained against farm's load
        for rep in range(args.reps):
            diffusers_load = [sys.executable, "-c", LOAD_DIFFUSERS, str(vae), args.model]
            record(f"load: diffusers from_pretrained(folder).to(cuda, bf16) #{rep + 1}",
                   run(diffusers_load, logs / f"load-d-{rep}.log", 300))
            record(f"load: farm decoder from the folder #{rep + 1}",
                   run([sys.executable, "-c", LOAD_FARM, str(job1)], logs / f"load-f-{rep}.log", 300))

    if "profile" in parts:  # where a GPU worker's decoder build spends its seconds
        for rep in range(args.reps):
            for mode in ("farm", "split"):
                cmd = [sys.executable, "-X", "importtime", "-c", PROFILE_BUILD, str(job1), mode]
                log = logs / f"profile-{mode}-{rep}.log"
                record(f"profile: worker build, {mode} #{rep + 1}", run(cmd, log, 300))

    if "one" in parts:
        for rep in range(args.reps):
            record(
                f"plain, one shot #{rep + 1}",
                run(
                    [*plain, "--out", str(work / f"plain1-{rep}"), *latents1], logs / f"plain1-{rep}.log", 300
                ),
            )
            record(f"farm render (own cluster), one shot #{rep + 1}",
                   run(farm_cmd("-v", "render", str(job1), "--out", str(work / f"cold1-{rep}")),
                       logs / f"cold1-{rep}.log", 300), farm=True)  # fmt: skip
            if args.spawned_too:
                record(f"farm render (own cluster, spawned workers), one shot #{rep + 1}",
                       run(farm_cmd("-v", "render", str(job1), "--out", str(work / f"spawned1-{rep}")),
                           logs / f"spawned1-{rep}.log", 300, env={"DASK_FARM__FORK_WORKERS": "false"}),
                       farm=True)  # fmt: skip
            for k, variant in enumerate(args.variant):
                name, _, value = variant.partition("=")
                record(f"farm render (own cluster, {variant}), one shot #{rep + 1}",
                       run(farm_cmd("-v", "render", str(job1), "--out", str(work / f"variant{k}-1-{rep}")),
                           logs / f"variant{k}-1-{rep}.log", 300, env={name: value}),
                       farm=True)  # fmt: skip

    if "warm" in parts:
        scheduler_file = work / "scheduler.json"
        cluster = start_cluster(scheduler_file, logs / "cluster.log")
        try:
            for k in range(args.warm_renders):
                record(f"farm render into farm cluster, render #{k + 1}",
                       run(farm_cmd("-v", "render", str(job1), "--out", str(work / f"warm1-{k}"),
                                    "--scheduler-file", str(scheduler_file)), logs / f"warm1-{k}.log", 300),
                       farm=True)  # fmt: skip
        finally:
            os.killpg(cluster.pid, signal.SIGTERM)
            cluster.wait(timeout=60)

    if "batch" in parts and args.batch:
        job_n = work / "job-batch.zarr"
        many = ("--shots", str(args.batch), "--overwrite")
        synth_n = farm_cmd("synth", str(job_n), "--weights", str(vae), *shape, *many)
        run(synth_n, logs / "synth-batch.log", 300)
        latents_n = export_latents(job_n, work / "latents-batch")
        record(
            f"plain, {args.batch} shots",
            run([*plain, "--out", str(work / "plain-batch"), *latents_n], logs / "plain-batch.log", 600),
        )
        record(f"farm render (own cluster), {args.batch} shots",
               run(farm_cmd("-v", "render", str(job_n), "--out", str(work / "cold-batch")),
                   logs / "cold-batch.log", 600), farm=True)  # fmt: skip

    if "single" in parts and args.single_file:
        job_s = work / "job-single.zarr"
        synth = run(farm_cmd("synth", str(job_s), "--weights", str(single), *shape, "--overwrite"),
                    logs / "synth-single.log", 300)  # fmt: skip
        record("farm synth --weights original-layout file", synth)
        if synth["rc"] == 0:
            record("farm render (own cluster), one shot, original-layout file",
                   run(farm_cmd("-v", "render", str(job_s), "--out", str(work / "cold-single")),
                       logs / "cold-single.log", 300), farm=True)  # fmt: skip

    lines = ["| row | wall s | figures |", "| --- | --- | --- |"]
    for name, row in rows.items():
        shown_keys = ("forkserver_started_s", "before_render_s", "setup_s", "graph_s", "finish_s",
                      "cluster_close_s")
        extra = row.get("steps") or {k: row[k] for k in shown_keys if k in row}
        shown = ", ".join(f"{k} {v:.2f}" for k, v in extra.items() if isinstance(v, int | float))
        failed = "" if row["rc"] == 0 else f" (rc {row['rc']})"
        lines.append(f"| {name} | {row['wall_s']:.2f}{failed} | {shown} |")
    (out / "real_path.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
