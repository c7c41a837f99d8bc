"""The `farm` command: parses arguments and calls the packages below it; nothing else lives here."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from farm import __version__, config, logs
from farm.decoders import FAMILIES
from farm.errors import FarmError
from farm.inputs.ingest import ingest
from farm.inputs.synthetic import synth
from farm.media.sequences import FORMATS as SEQUENCE_FORMATS
from farm.media.sequences import sequence_files
from farm.media.settings import VideoSettings
from farm.media.timeline import timeline_problem
from farm.planning.options import PlanOptions, parse_tiles, parse_triple
from farm.planning.tiling import ChunkSize
from farm.run.request import RenderRequest
from farm.run.validate import check_priority
from farm.run.worker_forkserver import forked_local_workers
from farm.run.worker_forkserver import started_at as worker_forkserver_started_at
from farm.store.output import Output
from farm.store.output_kinds import SHOT_OUTPUTS, TIMELINE
from farm.store.progress import output_progress

RECORDED = "unset, a rerun into OUT takes what OUT recorded"  # the options `farm.run.recorded` resumes

LOGGER = logging.getLogger("farm")
AddCommand = Callable[..., argparse.ArgumentParser]  # adds a subcommand: add(name, help=...)


class _HelpFormatter(argparse.HelpFormatter):
    """Help that ends each option with its default, where it has one (None/False: none shown)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "%(default)" not in text
            and action.option_strings
            and action.default is not None and action.default is not False  # 0 is a default to show
            and action.default != argparse.SUPPRESS
            and not isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._CountAction))
        ):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """A usage error in two lines, what was wrong and where the options are, instead of the usage."""

    def error(self, message: str) -> NoReturn:
        hint = f"{self.prog}: see '{self.prog} --help' for every option"
        self.exit(2, f"{self.prog}: error: {message}\n{hint}\n")


class _BadSetting:
    """A ``farm.KEY`` number default that is not one: reported, naming where it was set, only by a command
    that takes the option (`_check_settings`), so ``--help`` and other commands still work."""

    def __init__(self, error: FarmError, value: object) -> None:
        self.error, self.value = error, value

    def __str__(self) -> str:
        return repr(self.value)


def _number_setting(key: str) -> int | _BadSetting | None:
    if config.get(key) is None:
        return None
    try:
        return config.whole_number(key, minimum=None)  # the option's own check says which are valid
    except FarmError as exc:
        return _BadSetting(exc, config.get(key))


def _check_settings(args: argparse.Namespace) -> None:
    for value in vars(args).values():
        if isinstance(value, _BadSetting):
            raise value.error


def _verbosity_options(p: argparse.ArgumentParser, default: object) -> None:
    p.add_argument("-v", "--verbose", action="count", default=default,
                   help="more messages on stderr (-v: debug)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="count", default=default,
                   help="fewer messages on stderr (-q: warnings and errors, -qq: errors)")  # fmt: skip


def _decoder_configs() -> str:
    return ", ".join(f"{family}: {'/'.join(cls.named_configs)}" for family, cls in FAMILIES.items())


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="farm",
        description="Decode video-diffusion latents stored in Zarr to frames and videos on a Dask cluster. "
        "Defaults marked farm.KEY come from dask.config (YAML or DASK_FARM__KEY variables).",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"farm {__version__}")
    _verbosity_options(parser, 0)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _Parser(add_help=False)
    _verbosity_options(common, argparse.SUPPRESS)  # also after the command: farm render -q …

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], formatter_class=_HelpFormatter, **kwargs)

    _add_synth_command(add)
    _add_ingest_command(add)
    _add_render_command(add)
    _add_plan_command(add)
    _add_status_command(add)
    _add_demo_command(add)
    _add_cluster_command(add)
    _add_submit_command(add)
    _add_cancel_command(add)
    return parser


def _add_synth_command(add: AddCommand) -> None:
    p = add("synth", help="write a synthetic job (random latents, random-weight decoder)")
    p.add_argument("job", help="path of the job store to create (Zarr v3)")
    p.add_argument("--decoder", default="ltx2-tiny",
                   help=f"named decoder config ({_decoder_configs()}), or a JSON decoder spec such as "
                        '\'{"family": "ltx2", "config": {...}}\' (a custom config)')  # fmt: skip
    p.add_argument("--shots", type=int, default=1, help="number of shots")
    p.add_argument("--frames", type=int, default=17,
                   help="pixel frames per shot: 1 + t·k, t: the decoder's time scale (8: LTX)")  # fmt: skip
    p.add_argument("--height", type=int, default=128,
                   help="pixel height, a multiple of the decoder's spatial scale (32 for LTX)")  # fmt: skip
    p.add_argument("--width", type=int, default=192,
                   help="pixel width, a multiple of the decoder's spatial scale (32 for LTX)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed for latents and random weights")
    p.add_argument("--fps", default="24",
                   help="frames per second of every shot: a number or a ratio (24000/1001; 23.976 reads as "
                        "that too)")  # fmt: skip
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="decoder compute dtype (default: float32 for the -tiny configs, else bfloat16)")
    p.add_argument("--weights",
                   help="real weights: VAE folder, .safetensors or .pt/.pth (default: random ones)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing farm job store (any other file or folder is refused)")
    p.add_argument("--audio", action="store_true",
                   help="give every shot sound as long as its frames, for the decoder's own audio config "
                        "(ltx2-tiny: ltx2-audio-tiny, ltx2: ltx2-audio, ltx2.3[-tiny]: ltx2.3-audio[-tiny], "
                        "minimax-h3[-tiny]: minimax-h3-audio[-tiny]; docs/decoders.md gives their shapes and "
                        "rates)")  # fmt: skip
    p.add_argument("--audio-decoder", metavar="SPEC_OR_NAME",
                   help="sound for another audio config (a name, or a JSON audio decoder spec); "
                        "implies --audio (default: the decoder's own sound config)")  # fmt: skip
    p.add_argument("--audio-weights", metavar="PATH",
                   help="the audio decoder's real weights (pipeline folder, or the model's .safetensors; "
                        "default: random)")  # fmt: skip


def _add_ingest_command(add: AddCommand) -> None:
    p = add(
        "ingest", help="create or extend a job store from latent files (.latent, .safetensors, .pt, .npy)"
    )
    p.add_argument("job", help="job store (Zarr v3) to create or add shots to")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="latent files, folders of them, or globs")
    p.add_argument("--decoder", metavar="SPEC_OR_NAME",
                   help="named config (e.g. ltx2, with --weights), a JSON decoder spec or a .json file; "
                        "needed to create a job, checked against an existing one "
                        "(default: the job's)")  # fmt: skip
    p.add_argument("--weights", metavar="PATH",
                   help="decoder weights: VAE folder, .safetensors or .pt/.pth (default: the spec's)")
    p.add_argument("--fps", help="frames per second, a number or a ratio such as 24000/1001 (23.976 reads as "
                                 "that too) (default: the ComfyUI workflow's, else 24)")  # fmt: skip
    p.add_argument("--timecode", metavar="HH:MM:SS:FF",
                   help="start timecode of each shot's first frame (HH:MM:SS;FF drop-frame at 29.97/59.94) "
                        "(default: none)")  # fmt: skip
    p.add_argument("--name", metavar="PATTERN",
                   help="shot names from {stem}, {index} (sample in a batch), {n} (running number), {key} "
                        "(tensor name); default {stem}, or {stem}_{index} for a batch")  # fmt: skip
    p.add_argument("--latents", choices=["normalized", "denormalized"],
                   help="the files' convention (default: the job's; ComfyUI's: by model)")  # fmt: skip
    p.add_argument("--tensor", metavar="KEY",
                   help="the tensor to read in files that hold several (default: latent_tensor, latents, "
                        "latent or samples, else the only one)")  # fmt: skip
    p.add_argument("--replace", action="store_true", help="overwrite shots of the same name")
    p.add_argument("--decode-steps", type=int, metavar="N",
                   help="denoising steps of a diffusion decoder (ltx2-diffusion), kept in a new job's spec "
                        "(default: the decoder's own)")  # fmt: skip
    p.add_argument("--audio-tensor", metavar="KEY",
                   help="the tensor of each file holding the shot's audio latents, in the audio decoder's "
                        "layout: [C, T, M] for LTX-2, [2, C, T] for MiniMax-H3 "
                        "(default: none, no sound)")  # fmt: skip
    p.add_argument("--audio-decoder", metavar="SPEC_OR_NAME",
                   help="audio decoder of the sound: ltx2-audio (LTX-2, 24 kHz), ltx2.3-audio (LTX-2.3, "
                        "48 kHz) or minimax-h3-audio (MiniMax-H3, 32 kHz), with --audio-weights, or a JSON "
                        "spec; needed to create a job with sound (default: the job's)")  # fmt: skip
    p.add_argument("--audio-weights", metavar="PATH",
                   help="audio weights: a diffusers pipeline folder (audio_vae/, and vocoder/ for LTX-2), "
                        "an LTX-2 / LTX-2.3 .safetensors checkpoint, or MiniMax-H3's audio VAE folder or "
                        ".safetensors (default: the job's audio spec's)")  # fmt: skip


def _add_render_command(add: AddCommand) -> None:
    p = add("render", help="render every shot of a job to frames (Zarr) and videos (mp4)")
    p.add_argument("job", help="job store (Zarr v3) to render")
    p.add_argument("--out", required=True, help="output folder")
    _add_cluster_options(p, local=True)
    _add_plan_options(p)
    p.add_argument(
        "--window", type=int, default=_number_setting("window"),
        help="decoded tiles held at once (default: per GPU worker as many as fit beside a decode, 2 to 8; "
        "2 per worker on CPU); farm.window",
    )  # fmt: skip
    p.add_argument(
        "--restart", action="store_true", help="render over shots whose output came from other inputs or plan"
    )
    p.add_argument(
        "--compile", nargs="?", const=True, default=config.option("compile"), metavar="MODE",
        help="torch.compile the decoder on GPU workers; MODE: default, reduce-overhead (CUDA graphs), "
        "max-autotune, max-autotune-no-cudagraphs; farm.compile (kernels cached in farm.compile-cache)",
    )  # fmt: skip
    p.add_argument("--crf", type=int,
                   help=f"H.264/H.265 quality, lower is better ({RECORDED}); farm.crf "
                        f"(default: {config.option('crf')})")  # fmt: skip
    p.add_argument("--preset", help=f"x264/x265 preset ({RECORDED}); farm.preset "
                                    f"(default: {config.option('preset')})")  # fmt: skip
    p.add_argument("--no-video", action="store_true", help="write frames to Zarr only, no mp4")
    p.add_argument("--no-audio", action="store_true",
                   help="leave out the sound of shots that have it (no OUT/audio file, silent videos)")
    p.add_argument("--audio-format", choices=["wav", "flac"],
                   help="the sound file's format in OUT/audio (16-bit); videos carry AAC (mp4) or PCM (mov) "
                        f"({RECORDED}) (default: wav)")  # fmt: skip
    p.add_argument(
        "--codec",
        choices=["h264", "h265", "prores_hq", "prores_4444"],
        help="video codec: h264/h265 in .mp4, ProRes 422 HQ / 4444 in .mov "
        f"({RECORDED}); farm.codec (default: {config.option('codec')})",
    )
    p.add_argument(
        "--sequence",
        choices=["png8", "png16", "exr"],
        help="also write an image sequence OUT/sequences/<shot>/<shot>.####.<ext> "
        f"({RECORDED}) (default: none)",
    )
    p.add_argument("--exr-values", choices=["display", "linear"],
                   help="EXR sequences: display-referred BT.709 values as decoded, or scene-linear "
                        f"(BT.709 transfer inverted) ({RECORDED}); farm.exr-values "
                        f"(default: {config.option('exr-values')})")  # fmt: skip
    p.add_argument("--hdr", choices=["acescct", "logc3"],
                   help="HDR render: the decoded values are ACEScct (LTX-2 native) or LogC3 (LTX-2 HDR "
                        "IC-LoRA) codes; frames.zarr keeps float16 scene-linear values, EXR frames are "
                        "half-float, no SDR video is made (default: the job's decoder spec's 'hdr', "
                        "else SDR; recorded)")  # fmt: skip
    p.add_argument("--colorspace", metavar="SPACE",
                   help="colour space of EXR sequences and ProRes video, converted by OpenColorIO: "
                        "g24_rec709 (SDR only), lin_rec709, acescg, acescct (H.264/H.265 and an HDR "
                        "render's master stay as they are; default: as decoded; an HDR render's EXR: "
                        "acescg for ACEScct, lin_rec709 for LogC3; recorded)")  # fmt: skip
    p.add_argument("--first-frame", type=int,
                   help="number of each shot's first frame (Zarr frame coordinate, image sequences) "
                        f"({RECORDED}); farm.first-frame "
                        f"(default: {config.option('first-frame')})")  # fmt: skip
    p.add_argument(
        "--frames-dtype",
        choices=["uint8", "float16"],
        help="the Zarr master copy: 8-bit levels or float16 in [0, 1] "
        f"({RECORDED}); farm.frames-dtype (default: {config.option('frames-dtype')})",
    )
    p.add_argument(
        "--frames",
        dest="frame_range",
        metavar="LIST",
        help="render only these frames (numbered from --first-frame): 1-48, 1-100x2 (every 2nd), 1-100:2, "
        "10-1, 1,5,10-20 (default: every frame)",
    )
    p.add_argument("--priority", type=int, default=_number_setting("priority"),
                   help="on a shared cluster, higher priorities' tiles go first; farm.priority")  # fmt: skip
    p.add_argument("--timecode", metavar="HH:MM:SS:FF",
                   help="start timecode of every shot's first frame, for the video (tmcd), EXR headers and "
                        "Zarr attributes; HH:MM:SS;FF is drop-frame at 29.97/59.94 (default: the job's "
                        "shot timecode, else none)")  # fmt: skip


def _add_plan_command(add: AddCommand) -> None:
    p = add("plan", help="print the tile plan of a job without decoding anything")
    p.add_argument("job", help="job store (Zarr v3)")
    p.add_argument("--workers", type=int,
                   help="number of decode workers to plan for (default: what farm render would start here: "
                        "one per GPU, or up to 4 CPU processes)")  # fmt: skip
    p.add_argument("--no-video", action="store_true",
                   help="plan and predict a render that writes Zarr only (no video encodes)")  # fmt: skip
    _add_plan_options(p)


def _add_status_command(add: AddCommand) -> None:
    p = add("status", help="per-shot progress of a render output, read from the output alone")
    p.add_argument("out", help="render output folder")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--verify", action="store_true",
                      help="check every finished batch, video and sound file against its recorded checksum, "
                           "and timeline.otio against the finished shots (exit 1 when one is missing or "
                           "damaged: farm render renders it again)")  # fmt: skip
    what.add_argument("--renders", action="store_true",
                      help="the renders that wrote into OUT, from their histories (OUT/.farm/renders): host, "
                           "start, end (or running / stopped without an end), shots, outcome, workers lost "
                           "and joined, decode retries, failed shots and why")  # fmt: skip
    what.add_argument("--render", metavar="ID",
                      help="one render's history event by event: what its state machine heard and what it "
                           "decided (default: none; --renders lists the ids)")  # fmt: skip


def _add_demo_command(add: AddCommand) -> None:
    p = add("demo", help="synthesize a small ltx2-tiny job and render it")
    p.add_argument("--out", help="folder for the job and the render (default: a new temporary folder)")
    p.add_argument("--workers", type=int, default=None,
                   help="local workers (default: one per GPU, else up to 4 CPU processes)")


def _add_cluster_command(add: AddCommand) -> None:
    p = add("cluster", help="run a scheduler and workers until stopped (Ctrl-C): local, or in SLURM jobs")
    p.add_argument("--backend", default=None, metavar="NAME",
                   help="where the workers come from: auto, local-cuda, local-cpu or slurm (SLURM batch "
                        "jobs, docs/clusters.md); farm.cluster-backend "
                        f"(default: {config.option('cluster-backend')})")  # fmt: skip
    p.add_argument("--gpus", default="all", help="GPUs to use, one worker each: all or N (0: CPU workers)")
    p.add_argument("--workers", type=int,
                   help="CPU worker processes where there are no GPUs (default ≤ 4); in SLURM jobs, the "
                        "decode workers (default: farm.slurm-jobs' worth)")  # fmt: skip
    p.add_argument("--threads", type=int, help="task threads per worker (default: 1 on CPU, more on GPU)")
    p.add_argument("--protocol", choices=["ucx", "tcp"],
                   help="worker transport (default: ucx with several GPUs when installed, else tcp)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (0.0.0.0: reachable by other nodes)",
    )
    p.add_argument("--port", type=int, default=8786, help="scheduler port (0: any free)")
    p.add_argument("--dashboard-port", type=int, default=8787, help="dashboard port (0: any free)")
    p.add_argument("--memory-limit", default="auto", help="host memory per worker (Dask syntax, or none)")
    p.add_argument("--scheduler-file",
                   help="write the scheduler's address here (farm submit, dask worker) (default: none)")
    p.add_argument(
        "--io-workers",
        type=int,
        help="CPU-only worker processes for the writes and encodes beside GPU workers "
        "(default: farm.io-workers, else about one per 3 cores, at most 6 per GPU; none in SLURM)",
    )
    g = p.add_argument_group("SLURM jobs (--backend slurm), each option's default the farm.slurm-* setting")
    for flag, key, kind, metavar, what in SLURM_OPTIONS:
        default = config.option(key)
        shown = "none" if default in (None, "") else default
        g.add_argument(flag, type=kind, default=None, metavar=metavar,
                       action="append" if flag == "--slurm-directive" else "store",
                       help=f"{what}; farm.{key} (default: {shown})")  # fmt: skip


# farm cluster's options for the slurm backend: option, setting, type, what it sets
SLURM_OPTIONS: list[tuple[str, str, Any, str, str]] = [
    ("--slurm-jobs", "slurm-jobs", int, "N", "batch jobs to ask for, each one node's workers"),
    ("--slurm-gpus", "slurm-gpus", int, "N", "GPUs per job, one dask-cuda worker each (0: a CPU worker)"),
    ("--partition", "slurm-partition", str, "NAME", "the jobs' partition (#SBATCH -p)"),
    ("--account", "slurm-account", str, "NAME", "the jobs' account (#SBATCH -A)"),
    ("--time", "slurm-time", str, "TIME", "the jobs' time limit (#SBATCH -t), e.g. 04:00:00"),
    ("--slurm-directive", "slurm-directives", str, "DIRECTIVE",
     "one more #SBATCH line for every job, e.g. --slurm-directive=--constraint=h200 (repeat for more)"),
]  # fmt: skip


def _add_submit_command(add: AddCommand) -> None:
    p = add(
        "submit", help="run a workflow script against a running cluster",
        usage="farm submit WORKFLOW.py (--scheduler ADDRESS | --scheduler-file F) [--detach [--follow]] "
              "[--priority P] [-- ARGS...]",
    )  # fmt: skip
    p.add_argument("script", help="workflow script (.py) that uses the farm API (see farm.workflow)")
    _submit_options(p)
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script, after --")


def _add_cancel_command(add: AddCommand) -> None:
    p = add("cancel", help="cancel a render or a submitted workflow; finished batches stay")
    p.add_argument("id", help="render id or submission id (printed by farm render / farm submit), or OUT: "
                              "the output folder of a render running now (a local one too; its lock "
                              "records its render id and scheduler)")  # fmt: skip
    _add_cluster_options(p, local=False)
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for it to stop")
    p.add_argument("--force", action="store_true",
                   help="cancel it even when another user started it")  # fmt: skip


def _add_cluster_options(p: argparse.ArgumentParser, *, local: bool) -> None:
    """The cluster a command uses: a running one (--scheduler or --scheduler-file), or, with `local`, a
    local one it starts (--workers N)."""
    g = p.add_mutually_exclusive_group()
    if local:
        g.add_argument(
            "--workers",
            type=int,
            help="start a local cluster of N workers (default: one per GPU, or up to 4 CPU processes; or "
            "the cluster at Dask's scheduler-address, DASK_SCHEDULER_ADDRESS, when that is set)",
        )
    unset = "a local cluster" if local else "none"
    g.add_argument("--scheduler", help="address of a running Dask scheduler (tcp://host:port) (default: "
                   f"Dask's scheduler-address, DASK_SCHEDULER_ADDRESS, else {unset})")  # fmt: skip
    g.add_argument("--scheduler-file", help="scheduler file of a running Dask cluster (default: none)")


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tiles",
        default=config.option("tiles"),
        metavar="F,H,W|auto",
        help="tiles per shot along frames, height, width; auto chooses per shot by the predicted "
        "makespan of the job on the cluster's workers (whole shots when there are enough), and without "
        "--chunk may carry the temporal chunks of a causal decoder (--chunk 5,0,0 --carry) where that "
        "is predicted to pay; farm.tiles",
    )
    p.add_argument(
        "--cost-model", metavar="NAME|PATH", help="cost model for auto tiles (default: the decoder's)"
    )
    p.add_argument(
        "--overlap",
        metavar="F,H,W",
        help="overlap of neighbouring tiles in latent units (default where split: 1 frame, and the "
        "decoder's measured spatial overlap, e.g. 4 rows and columns for ltx2)",
    )
    p.add_argument(
        "--batch-frames",
        type=int,
        metavar="N",
        help="pixel frames per output batch: one blend task, Zarr chunks and video segment "
        f"({RECORDED}); farm.batch-frames (default: {config.option('batch-frames')})",
    )
    p.add_argument("--chunk", metavar="F,H,W",
                   help="largest latent block one decode call takes inside a worker (0 = no limit), "
                        "to bound GPU memory (default: no limit)")  # fmt: skip
    p.add_argument("--carry", action="store_true",
                   help="with a temporal --chunk: decode a tile's chunks in order, each starting from "
                        "the decoder's causal state where the last one stopped (no overlap or context "
                        "decoded twice; a shot's first batches are written while later chunks decode; "
                        "the last chunks halve down to one latent frame). Causal LTX-2 configs only: "
                        "the released decoders look ahead in time and refuse it")  # fmt: skip
    p.add_argument("--gpu-memory", metavar="SIZE",
                   help="GPU memory each decode worker is planned for and held to, e.g. 24GiB: plans for a "
                        "smaller GPU than the one present, for GPUs that differ, or to share one (going "
                        "over fails the tile instead of passing); farm.gpu-memory (default: what each "
                        "worker's GPU has)")  # fmt: skip
    p.add_argument("--shots", help="comma-separated shot names (default: every shot)")


def _submit_options(p: argparse.ArgumentParser) -> None:
    _add_cluster_options(p, local=False)
    p.add_argument("--detach", action="store_true",
                   help="run the script on the cluster: it goes on when this command exits")  # fmt: skip
    p.add_argument("--follow", action="store_true", help="with --detach: print its log until it ends")
    p.add_argument("--priority", type=int, help="priority of the workflow's renders (default 0)")


def _split_submit_args(args: argparse.Namespace) -> argparse.Namespace:
    """`farm submit WORKFLOW.py [options] [-- ARGS…]`: options may follow the script; ARGS follow ``--``."""
    rest = list(args.args)
    cut = rest.index("--") if "--" in rest else len(rest)
    own, script_args = rest[:cut], rest[cut + 1 :]
    if getattr(args, "script_args", None) is not None:  # split off by `_parse`, its "--" kept out
        script_args = args.script_args
    parser = argparse.ArgumentParser(prog="farm submit WORKFLOW.py", add_help=False)
    _submit_options(parser)
    parsed, unknown = parser.parse_known_args(own)
    if unknown:
        raise FarmError(
            f"farm submit: {' '.join(unknown)!r} is not an option of farm submit; "
            "put the workflow's own arguments after --, e.g. farm submit wf.py --scheduler-file F -- ARGS"
        )
    for name, value in vars(parsed).items():
        if value not in (None, False):
            setattr(args, name, value)
    if args.scheduler and args.scheduler_file:
        raise FarmError("give one of --scheduler and --scheduler-file")
    args.args = script_args
    args.priority = args.priority or 0

    check_priority(args.priority)
    return args


def _plan_options(args: argparse.Namespace):
    chunk = ChunkSize()
    if args.chunk:
        f, h, w = (v or None for v in parse_triple(args.chunk, "--chunk", minimum=0))
        chunk = ChunkSize(frames=f, height=h, width=w, carry=bool(getattr(args, "carry", False)))
    elif getattr(args, "carry", False):
        raise FarmError(
            "--carry needs a temporal chunk to carry the state across, e.g. --chunk 4,0,0 --carry"
        )
    return PlanOptions(
        tiles=parse_tiles(args.tiles),
        cost_model=args.cost_model,
        overlap=parse_triple(args.overlap, "--overlap", minimum=0) if args.overlap else None,
        batch_frames=config.whole_number("batch-frames", 1) if args.batch_frames is None
        else args.batch_frames,
        chunk=chunk,
        **({"worker_memory": config.parse_size(args.gpu_memory, "--gpu-memory")} if args.gpu_memory else {}),
    )


def progress_bar(started: float | None = None):
    """A one-line progress bar on a terminal, on stderr (tiles decoded, batches written); nothing
    otherwise. Its clock starts at `started` (the command's start: cluster start-up and set-up count)."""
    from tqdm import tqdm

    bar = None
    started = time.time() if started is None else started

    def update(stats) -> None:
        nonlocal bar
        if bar is None:
            quiet = LOGGER.getEffectiveLevel() > logging.INFO
            bar = tqdm(total=stats.batches_total, unit="batch", disable=True if quiet else None,
                       dynamic_ncols=True)  # fmt: skip
            bar.start_t = bar.last_print_t = started
        bar.set_postfix_str(f"tiles {stats.tiles_decoded}/{stats.tiles_total}", refresh=False)
        bar.n = stats.batches_written
        bar.refresh()
        if stats.seconds:
            bar.close()

    return update


def _report(stats, out: Path) -> int:
    """The outputs on stdout (what a script reads); what was written, and failures, on stderr."""
    logs.message(summary_line(stats, out))
    if stats.encoded_bits_per_pixel is not None:  # what `farm plan` predicts encodes with, when told
        bits = stats.encoded_bits_per_pixel
        LOGGER.info(f"videos written at {bits:.3g} bits per pixel ({stats.encode_s:.1f} s of encodes); "
                    "farm.encoded-bits-per-pixel plans encodes of frames like these")  # fmt: skip
    for line in output_lines(Output(Path(os.path.abspath(out))), list(stats.shots)):
        print(line)
    for message in failure_lines(stats.failed):
        LOGGER.error(message)
    if stats.cancelled:
        names = ", ".join(repr(s.shot) for s in stats.cancelled)
        LOGGER.error(f"cancelled before shots {names} finished; their finished batches are kept")
    if stats.failed or stats.cancelled:
        done = len(stats.shots) - len(stats.failed) - len(stats.cancelled)
        LOGGER.error(f"{done} of {len(stats.shots)} shots finished; rerun to resume the others")
        return 1 if stats.failed else EXIT_INTERRUPTED
    return 0


def summary_line(stats, out: Path) -> str:
    """What this render wrote (frames and batches, of those it was to render), and how much of its shots
    OUT now holds, as `farm status OUT` counts it."""
    rows = [row for row in output_progress(out) if row.shot in stats.shots]
    held = sum(row.batches_done for row in rows)
    total = sum(row.batches_total or 0 for row in rows)
    finished = sum(row.finished for row in rows)
    return (f"farm: wrote {stats.frames_written} frames in {stats.batches_written} batch(es) of the "
            f"{stats.batches_total} this render was to write ({stats.tiles_decoded} tiles decoded) in "
            f"{stats.seconds:.1f} s (+ {stats.setup_s:.1f} s set-up, {stats.finish_s:.1f} s finishing); OUT "
            f"holds {held} of {total} batches of its {len(rows)} shot(s), {finished} finished")  # fmt: skip


def output_lines(out: Output, shots: list[str]) -> list[str]:
    """The summary's lines, ``  <kind>: <absolute path>`` (video and sound aligned with frames), one per
    output OUT holds for `shots`: the Zarr frames, then per shot its shot outputs (video, sound file) and
    image sequence (folder and file pattern), and the timeline."""
    lines = [f"  frames: {out.frames_zarr}"]
    for shot in shots:
        for kind in SHOT_OUTPUTS:
            if kind.marker(out, shot).exists():
                paths = [kind.file(out, shot, suffix) for suffix in kind.every_suffix()]
                lines += [f"  {kind.name + ':':7} {path}" for path in paths if path.exists()]  # under frames:
        folder = out.sequence_dir(shot)
        for ext in dict.fromkeys(f.ext for f in SEQUENCE_FORMATS.values()) if folder.is_dir() else ():
            numbers = list(sequence_files(folder, shot, ext))
            if numbers:
                frames = f"frames {numbers[0]}-{numbers[-1]}"
                lines.append(f"  sequence: {folder}/{shot}.####.{ext} ({frames})")
    if TIMELINE.intact(out):
        lines.append(f"  timeline: {TIMELINE.file(out)}")
    return lines


def failure_lines(failed: list) -> list[str]:
    """One line per failed shot's error; shots that failed with the same error (a full disk) share one."""
    by_error: dict[str, list[str]] = {}
    for shot in failed:
        if f"shot {shot.shot!r}" in shot.error:
            by_error[shot.error] = []
        else:
            by_error.setdefault(shot.error, []).append(shot.shot)
    lines = []
    for error, shots in by_error.items():
        names = ", ".join(repr(s) for s in shots)
        lines.append(error if not shots else f"{'shot' if len(shots) == 1 else 'shots'} {names}: {error}")
    return lines


def cmd_synth(args: argparse.Namespace) -> int:
    target = Path(args.job)
    if (target.exists() or target.is_symlink()) and not args.overwrite:  # named as this command sets it
        raise FarmError(f"job store {args.job!r} already exists; choose a new path, or --overwrite")
    job = synth(
        args.job, decoder=args.decoder, shots=args.shots, frames=args.frames, height=args.height,
        width=args.width, seed=args.seed, fps=args.fps, dtype=args.dtype, weights=args.weights,
        overwrite=args.overwrite, audio=args.audio_decoder or args.audio, audio_weights=args.audio_weights,
    )  # fmt: skip
    sound = f", sound {job.audio.describe()}" if job.audio is not None else ""
    LOGGER.info(f"wrote job {job.path} with {len(job.shots)} shot(s), decoder {job.spec.describe()}{sound}")
    print(job.path)  # what a script reads; the line above is a message (-q quiets it)
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    from tqdm import tqdm


    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            quiet = LOGGER.getEffectiveLevel() > logging.INFO or total < 2
            bar = tqdm(total=total, unit="shot", disable=True if quiet else None, dynamic_ncols=True)
        bar.n = done
        bar.refresh()

    try:
        result = ingest(
            args.job, args.sources, decoder=args.decoder, weights=args.weights, fps=args.fps, name=args.name,
            latents=args.latents, tensor=args.tensor, replace=args.replace, on_progress=progress,
            audio_tensor=args.audio_tensor, audio_decoder=args.audio_decoder,
            audio_weights=args.audio_weights, decode_steps=args.decode_steps, timecode=args.timecode,
        )  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    for line in result.warnings:
        LOGGER.warning(line)
    verb = "created" if result.created else "added to"
    replaced = f", replaced {', '.join(result.replaced)}" if result.replaced else ""
    LOGGER.info(f"{verb} {result.job}: {len(result.shots)} shot(s) of {result.latents} latents{replaced}")
    for name in result.shots:  # what a script reads: the shots' names, one a line (-q leaves them)
        print(name)
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    import dask.config

    age = logs.process_age_s()
    joins = config.joins_running_cluster(args.scheduler, args.scheduler_file, args.workers)
    with dask.config.set(forked_local_workers(joins=joins)):  # first: the workers' imports start now
        server = worker_forkserver_started_at()
        if age is not None:
            LOGGER.debug("the command's start (Python, farm's imports) %.2f s before the render's%s", age,
                         f"; the worker forkserver started at {server:.2f} s" if server is not None else "")
        return _render(args)


def _render(args: argparse.Namespace) -> int:
    from farm.run.render import run_render  # Dask distributed: this command's alone

    request = RenderRequest(
        args.job, args.out, workers=args.workers, scheduler=args.scheduler,
        scheduler_file=args.scheduler_file, options=_plan_options(args),
        shots=args.shots.split(",") if args.shots else None,
        video=_video_settings(args), given=_given_options(args),
        window=args.window, restart=args.restart, frames=args.frame_range,
        compile=args.compile, log=logs.message,
        on_progress=progress_bar(args.started),
        priority=args.priority,
    )  # fmt: skip
    return _report(run_render(request), Path(args.out))


def _video_settings(args: argparse.Namespace) -> VideoSettings:
    """``farm render``'s output options; those left out are farm's settings (`farm.config`) until
    `farm.run.recorded` gives them OUT's."""
    unset_is_configured = {"codec": args.codec, "crf": args.crf, "preset": args.preset,
                           "first_frame": args.first_frame,
                           "frames_dtype": args.frames_dtype, "exr_values": args.exr_values,
                           "audio_format": args.audio_format}  # fmt: skip
    return VideoSettings(enabled=not args.no_video, sequence=args.sequence,
                         audio=not args.no_audio, timecode=args.timecode, hdr=args.hdr,
                         colorspace=args.colorspace,
                         **{k: v for k, v in unset_is_configured.items() if v is not None})  # fmt: skip


def _given_options(args: argparse.Namespace) -> frozenset[str]:
    """The options OUT records that this command line sets (the others resume OUT's, `farm.run.recorded`)."""
    values = {"--batch-frames": args.batch_frames, "--codec": args.codec, "--crf": args.crf,
              "--preset": args.preset, "--sequence": args.sequence,
              "--first-frame": args.first_frame, "--frames-dtype": args.frames_dtype,
              "--exr-values": args.exr_values, "--audio-format": args.audio_format,
              "--hdr": args.hdr, "--colorspace": args.colorspace, "--timecode": args.timecode,
              "--no-video": args.no_video or None}  # fmt: skip
    return frozenset(option for option, value in values.items() if value is not None)


def cmd_plan(args: argparse.Namespace) -> int:
    from farm.run.plan_report import plan_report  # Dask distributed: this command's alone

    shots = args.shots.split(",") if args.shots else None
    report = plan_report(args.job, _plan_options(args), args.workers, shots, video=not args.no_video)
    for problem in report.skipped:  # shots that cannot be planned, named; the others are
        LOGGER.error(f"{problem} (left out of the plan)")
    print(report.table())
    if report.refusal is not None:  # after the table: it shows why
        raise report.refusal
    print(report.summary())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if args.renders or args.render:
        return _print_histories(Output(Path(args.out)), args.render)
    rows = output_progress(args.out, verify=args.verify)
    state = f"{'video':<9}  damaged" if args.verify else "video"
    print(f"{'shot':<24} {'batches':>11} {'frames':>7}  {state}")
    for row in rows:
        total = "?" if row.batches_total is None else str(row.batches_total)
        video = "done" if row.video else "cancelled" if row.cancelled else "-"
        state = f"{video:<9}  {row.damaged:>7}" if args.verify else video
        print(f"{row.shot:<24} {f'{row.batches_done}/{total}':>11} {row.frames:>7}  {state}")
    finished = sum(r.finished for r in rows)
    cancelled = sum(r.cancelled for r in rows)
    print(f"{finished} of {len(rows)} shots finished" + (f", {cancelled} cancelled (a rerun resumes them)"
                                                          if cancelled else ""))  # fmt: skip
    for row in rows:
        for line in row.damaged_outputs:  # what is damaged, one file a line
            LOGGER.error(f"shot {row.shot!r} {line}")
        if row.superseded:
            LOGGER.error(f"shot {row.shot!r} was decoded with {row.superseded}: its output is not what "
                         "this farm decodes; farm render --restart renders it again")  # fmt: skip
    lost = sum(r.damaged or 0 for r in rows)
    timeline = TIMELINE.file(Output(Path(args.out)))
    problem = timeline_problem(timeline, [r.shot for r in rows if r.finished]) if args.verify else None
    if problem:
        LOGGER.error(f"{str(timeline)!r} {problem}")
        lost += 1
    if any(r.superseded for r in rows) and not lost:
        return 1
    if lost:
        LOGGER.error(f"{lost} finished output(s) are missing or damaged; farm render into this output "
                     "renders them again")  # fmt: skip
        return 1
    return 0


def _print_histories(out: Output, render_id: str | None) -> int:
    """`farm status OUT --renders` / `--render ID`: read from OUT's render histories alone."""
    from farm import render_history
    from farm.store.lock import held_shots
    from farm.store.render_logs import read_histories

    if not out.root.is_dir():
        raise FarmError(f"output folder {str(out.root)!r} does not exist: give the OUT a render wrote into")
    running = {str(r.get("render")) for r in held_shots(out.root).values()}
    histories = {h.render_id: h for h in read_histories(out)}
    if render_id is None:
        if not histories:
            print(f"no render histories in {str(out.renders_dir)!r}")
            return 0
        for line in render_history.table([render_history.summarise(h, running) for h in histories.values()]):
            print(line)
        return 0
    if render_id not in histories:
        known = ", ".join(sorted(histories)) or "none"
        raise FarmError(f"output {str(out.root)!r} holds no history of render {render_id!r} (renders: "
                        f"{known}; farm status OUT --renders lists them)")  # fmt: skip
    for line in render_history.event_lines(histories[render_id], running):
        print(line)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import dask.config

    with dask.config.set(forked_local_workers(joins=False)):  # first: the workers' imports start now
        return _demo(args)


def _demo(args: argparse.Namespace) -> int:
    from farm.run.render import render  # Dask distributed: this command's alone

    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="farm-demo-"))
    job_path, out = root / "job.zarr", root / "render"
    if os.path.lexists(job_path) and not _made_by_demo(job_path):
        raise FarmError(
            f"farm demo --out {str(root)!r}: {str(job_path)!r} is already there and farm demo did not make "
            "it; nothing was changed. Give the demo another --out (or a new folder)"
        )
    job = synth(job_path, decoder="ltx2-tiny", shots=2, frames=33, height=128, width=192, overwrite=True)
    _mark_demo(job_path)
    print(f"farm demo: job {job.path} ({len(job.shots)} shots of 33 frames, 192x128, ltx2-tiny)")
    stats = render(
        job_path, out, workers=args.workers, options=PlanOptions(tiles=(2, 1, 2), batch_frames=16),
        on_progress=progress_bar(args.started), log=logs.message,
    )  # fmt: skip
    return _report(stats, out)


DEMO_MARK = "farm demo"  # the job store's attrs farm.made_by: a later demo may replace it


def _made_by_demo(job_path: Path) -> bool:
    """Whether the job store at `job_path` is one `farm demo` made (its root attributes say so)."""
    from farm.safe_read import read_json

    try:
        meta = read_json(job_path / "zarr.json")
        return bool(meta["attributes"]["farm"]["made_by"] == DEMO_MARK) and not job_path.is_symlink()
    except (OSError, FarmError, KeyError, TypeError):
        return False


def _mark_demo(job_path: Path) -> None:
    import zarr

    root = zarr.open_group(store=str(job_path), mode="r+")
    meta = root.attrs["farm"]
    assert isinstance(meta, dict)  # synth has just written it
    root.attrs["farm"] = {**meta, "made_by": DEMO_MARK}


def cmd_cluster(args: argparse.Namespace) -> int:
    import dask.config

    settings = {f"farm.{key}": getattr(args, flag[2:].replace("-", "_")) for flag, key, *_ in SLURM_OPTIONS}
    settings = {key: value for key, value in settings.items() if value is not None}
    if args.backend is not None:
        settings["farm.cluster-backend"] = args.backend
    with dask.config.set(settings), dask.config.set(forked_local_workers(joins=False)):
        from farm.run.clusterd import parse_gpus, serve  # Dask distributed: this command's alone

        return serve(
            gpus=parse_gpus(args.gpus), workers=args.workers, protocol=args.protocol, host=args.host,
            port=args.port, dashboard_port=args.dashboard_port, scheduler_file=args.scheduler_file,
            threads_per_worker=args.threads, io_workers=args.io_workers,
            memory_limit=None if args.memory_limit == "none" else args.memory_limit,
            log=lambda line: print(line, flush=True),
        )  # fmt: skip


def cmd_submit(args: argparse.Namespace) -> int:
    from farm import submit  # Dask distributed: this command's alone

    args = _split_submit_args(args)
    address = submit.resolve_address(args.scheduler, args.scheduler_file)
    if not args.detach:
        if args.follow:
            raise FarmError("--follow goes with --detach (a foreground workflow prints its own output)")
        return submit.run_foreground(args.script, args.args, address, priority=args.priority)
    # stdout carries the submission id alone (SID=$(farm submit --detach …)); the messages go to stderr
    sid = submit.submit_detached(args.script, args.args, address, priority=args.priority,
                                 log=_to_stderr)  # fmt: skip
    print(sid, flush=True)
    if args.follow:
        return submit.follow(address, sid, log=_to_stderr)
    return 0


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_cancel(args: argparse.Namespace) -> int:
    from farm import submit  # Dask distributed: this command's alone

    if os.path.isdir(args.id):  # OUT: every render writing into it, at the scheduler its locks record
        codes = []
        for target, address in submit.renders_writing(args.id):
            if args.scheduler or args.scheduler_file:
                address = submit.resolve_address(args.scheduler, args.scheduler_file)
            ended = functools.partial(submit.render_ended, args.id, target)
            codes.append(submit.cancel(target, address, wait=args.wait, force=args.force, log=_to_stderr,
                                       ended=ended))  # fmt: skip
        return max(codes)
    address = submit.resolve_address(args.scheduler, args.scheduler_file)
    return submit.cancel(args.id, address, wait=args.wait, force=args.force, log=_to_stderr)


COMMANDS = {
    "synth": cmd_synth,
    "ingest": cmd_ingest,
    "render": cmd_render,
    "plan": cmd_plan,
    "status": cmd_status,
    "demo": cmd_demo,
    "cluster": cmd_cluster,
    "submit": cmd_submit,
    "cancel": cmd_cancel,
}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt, so both stop a command the same way."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


# Exit codes: 2 for a user error, 130 for Ctrl-C (128 + SIGINT), 143 for SIGTERM (128 + SIGTERM).
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse `argv`; for `farm submit`, everything after the first ``--`` is the workflow's, untouched
    (argparse would drop that ``--`` before the script's options and read them as farm's own)."""
    if "--" in argv:
        cut = argv.index("--")
        head = parser.parse_args(argv[:cut]) if "submit" in argv[:cut] else None
        if head is not None and head.command == "submit":
            head.script_args = argv[cut + 1 :]
            return head
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = _parse(build_parser(), list(sys.argv[1:] if argv is None else argv))
    args.started = started
    logs.setup(args.verbose - args.quiet)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        _check_settings(args)
        return COMMANDS[args.command](args)
    except FarmError as exc:
        print(f"farm: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print("farm: terminated (SIGTERM); finished batches are kept, rerun to resume", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("farm: interrupted; finished batches are kept, rerun to resume", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
