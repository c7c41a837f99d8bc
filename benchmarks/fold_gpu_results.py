"""The markdown rows of docs/fidelity.md, docs/decoders.md and docs/performance.md from GPU result files.

Reads what `benchmarks/gpu_pending.sh` brings back (``callN.tar.gz``, an unpacked folder, or single JSON
files) and prints, per doc section, the rows its table takes (the doc's own columns), each row's figures
read from one result file (the files named under the table, in row order):

* ``measure_halo.py halo`` → fidelity.md, "Halo" table (seam-band PSNR / worst pixel per halo; the least
  reaching the floor in bold and as the recorded value; blend kept as the adapter decides it now);
* ``measure_halo.py context`` → fidelity.md, the temporal context table and its sentence;
* ``bench_seamless.py`` → fidelity.md, "Through `farm render`, as users run it";
* ``bench_family_decode.py`` → decoders.md, "Decode time per family";
* ``bench_real_path.py`` (``real_path.json``) → performance.md, "The real path" (cold one shot, alternated);
* ``measure_groupnorm_rounds.py`` → fidelity.md, "Statistics rounds" (with ``--dtype-noise``, the tiles and
  the whole decode from float32).

A step that was skipped or failed (its ``index.txt`` line, or a result with NaN) is listed first; no row
is printed for what is not there.

    python benchmarks/fold_gpu_results.py /work/.device/7/*.tar.gz
    python benchmarks/fold_gpu_results.py /tmp/gpu-pending --out-md rows.md
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import statistics
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HALO_COLUMNS = (2, 4, 6, 8, 10, 12)
SEAM_BAND_FRAMES = 8  # measure_halo.py's band, each side of a temporal seam
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16"}  # as the docs' tables name them


def dtype_name(dtype: str) -> str:
    return DTYPE_NAMES.get(dtype, dtype)


def read_results(paths: list[Path]) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """(name, JSON) of every result file, and the lines of every call index, from archives, folders and
    files."""
    results: list[tuple[str, dict[str, Any]]] = []
    index: list[str] = []

    def take(name: str, text: str) -> None:
        if name.endswith("index.txt"):  # a call's index, or its copy beside the archive
            index.extend(line for line in text.splitlines() if line not in index)
        else:
            try:
                results.append((name, json.loads(text)))
            except json.JSONDecodeError as exc:
                index.append(f"== {name}: not JSON ({exc})")

    for path in paths:
        if path.is_dir():
            for file in sorted(path.rglob("*")):
                if file.is_file() and (file.suffix == ".json" or file.name.endswith("index.txt")):
                    take(str(file.relative_to(path)), file.read_text())
        elif path.name.endswith((".tar.gz", ".tgz", ".tar")):
            with tarfile.open(path) as archive:
                for member in archive.getmembers():
                    if member.isfile() and (
                        member.name.endswith(".json") or member.name.endswith("index.txt")
                    ):
                        data = archive.extractfile(member)
                        if data is not None:
                            take(member.name, io.TextIOWrapper(data, encoding="utf-8").read())
        elif path.suffix == ".json" or path.name.endswith("index.txt"):
            take(path.name, path.read_text())
        else:
            raise SystemExit(f"fold_gpu_results: {path} is no result archive, folder or JSON file")
    return results, index


def number(x: Any, digits: int = 1) -> str:
    if x is None:
        return "–"
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "∞"
    return f"{x:.{digits}f}"


def band_worst(row: dict[str, Any]) -> str:
    return f"{number(row['band_psnr_db'])} / {number(row['worst_levels'], 0)}"


def has_nan(row: dict[str, Any]) -> bool:
    return any(isinstance(v, float) and math.isnan(v) for v in row.values())


def adapter_facts(decoder: str, shape: list[int]) -> tuple[str, str]:
    """(pixel shot 'F×H×W' for the latent `shape`, the blend the adapter keeps beside its halo now)."""
    from farm.decoders import decoder_class
    from farm.inputs.synthetic import synth_spec

    spec = synth_spec(decoder, seed=0)
    cls = decoder_class(spec)
    pixels = cls.geometry_for_spec(spec).pixel_shape(tuple(shape))
    blend = "no" if cls.halo_is_exact(spec.config) else f"yes, overlap {cls.spatial_overlap_for(spec.config)}"
    return "×".join(str(p) for p in pixels), blend


def halo_rows(items: list[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    yield "| config, dtype, shot | halo 2 | 4 | 6 | 8 | 10 | 12 | recorded | blend kept |"
    yield "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    for _, r in items:
        shot, blend = adapter_facts(r["decoder"], r["shape"])
        sweep = [row for row in r["rows"] if isinstance(row["value"], int)]
        noise = next((row for row in r["rows"] if not isinstance(row["value"], int)), None)
        notes = []
        if r.get("whole_frame"):
            notes.append("whole-frame pass")
        if noise is not None:
            notes.append(f"{dtype_name(r['dtype'])} itself {number(noise['psnr_db'])} dB from float32")
            least = next((row for row in sweep if row["value"] == r["least"] and "float32" in row), None)
            if least is not None:  # the tiles measured from float32 too (`--dtype-noise`)
                tiled, whole = least["float32"]["tiled"], least["float32"]["whole"]
                notes.append(f"its tiles at {least['value']} {number(tiled['band_psnr_db'])} dB from it over "
                             f"the seams, the whole decode {number(whole['band_psnr_db'])}")  # fmt: skip
        outside = [row for row in sweep if row["value"] not in HALO_COLUMNS]
        if outside:
            notes.append("; ".join(f"halo {row['value']}: {band_worst(row)}" for row in outside))
        label = f"{r['decoder']} {dtype_name(r['dtype'])} {shot}" + (
            f" ({'; '.join(notes)})" if notes else ""
        )
        cells = []
        for column in HALO_COLUMNS:
            row = next((row for row in sweep if row["value"] == column), None)
            text = "" if row is None else band_worst(row)
            cells.append(f"**{text}**" if row is not None and row["value"] == r["least"] else text)
        recorded = str(r["least"]) if r["least"] is not None else "not reached"
        yield f"| {label} | {' | '.join(cells)} | {recorded} | {blend} |"


def context_rows(items: list[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    yield "| config | context (latent frames) | lookahead | how it decays |"
    yield "| --- | --- | --- | --- |"
    sentences = []
    for _, r in items:
        sweep = [row for row in r["rows"] if isinstance(row["value"], int)]
        least = r["least"]
        decay = ", ".join(
            f"{'**' if row['value'] == least else ''}{number(row['band_psnr_db'])}"
            f"{'**' if row['value'] == least else ''} at {row['value']}"
            for row in sweep
        )
        shape = "×".join(str(s) for s in r["shape"])
        measured = (
            f"**{least}** (measured, {dtype_name(r['dtype'])})"
            if least is not None
            else f"not reached ({dtype_name(r['dtype'])})"
        )
        yield (
            f"| {r['decoder']} | {measured} | as the context (swept together) | {shape} latent frames, rows, "
            f"columns, band PSNR (dB): {decay} |"
        )
        values = " / ".join(str(row["value"]) for row in sweep)
        bands = " / ".join(
            f"**{number(row['band_psnr_db'])}**" if row["value"] == least else number(row["band_psnr_db"])
            for row in sweep
        )
        worst = " / ".join(number(row["worst_levels"], 0) for row in sweep)
        sentences.append(
            f"{r['decoder']} {dtype_name(r['dtype'])} ({shape} latent) at {values} frames: {bands} dB over "
            f"the {2 * SEAM_BAND_FRAMES} frames around the seam (worst {worst} levels; records {least})"
        )
    yield ""
    yield from sentences


def seamless_rows(items: list[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    yield (
        "| shot | `--gpu-memory` | plan | redundant work | PSNR clip / seam band (uint8) | worst pixel | "
        "nvidia-smi peak | renders untiled / tiled |"
    )
    yield "| --- | --- | --- | --- | --- | --- | --- | --- |"
    for _, r in items:
        grid = "×".join(str(t) for t in r["grid"])
        blend = "no blend" if not any(r["overlap"]) else f"overlap {max(r['overlap'])}"
        shot = "×".join(str(s) for s in r["shape"])
        # float16: the frames as written, in levels of 255 (the band and worst pixel where measured)
        written = number(r["psnr_float16_db"])
        if "band_psnr_float16_db" in r:
            written += f" / {number(r['band_psnr_float16_db'])}"
        worst = f"{number(r['worst_levels'], 0)} levels"
        if "worst_float16_levels" in r:
            worst += f" (float16 {number(r['worst_float16_levels'])})"
        yield (
            f"| {r['decoder']} {dtype_name(r['dtype'])}, {shot} | {r['gpu_memory']} | "
            f"{grid}, halo {r['halo']}, {blend} | "
            f"{number(r['redundancy'], 2)}× | {number(r['psnr_db'])} / {number(r['band_psnr_db'])} dB "
            f"(float16 {written} dB) | {worst} | "
            f"{number(r['nvidia_smi_peak_gib'])} GiB | {number(r['whole_render_s'])} / "
            f"{number(r['tiled_render_s'])} s |"
        )


def rounds_rows(items: list[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    yield ("| config, dtype, shot, grid | halo | PSNR clip / seam band | worst pixel | mid block shared "
           "alone: band / worst | work | carried per tile | a round's peak | from float32, band: tiles / "
           "whole |")  # fmt: skip
    yield "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    for _, r in items:
        shot, _ = adapter_facts(r["decoder"], r["shape"])
        grid = "×".join(str(t) for t in r["grid"])
        for row in r["rows"]:
            mid = row["mid_block_only"]
            peak = row.get("round_peak_mib")
            f32 = row.get("float32")
            against = "" if f32 is None else (f"{number(f32['tiled']['band_psnr_db'])} / "
                                              f"{number(f32['whole']['band_psnr_db'])} dB")  # fmt: skip
            yield (
                f"| {r['decoder']} {dtype_name(r['dtype'])} {shot}, {grid} | {row['halo']} | "
                f"{number(row['psnr_db'])} / {number(row['band_psnr_db'])} dB | "
                f"{number(row['worst_levels'], 0)} levels | "
                f"{number(mid['band_psnr_db'])} dB / {number(mid['worst_levels'], 0)} | "
                f"{number(row['redundancy'], 2)}× | {number(row['carried_mib'] / 1024)} GiB | "
                f"{'–' if peak is None else number(peak / 1024) + ' GiB'} | {against} |"
            )


def decode_rows(items: list[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    yield (
        "| config | dtype | latent → pixels | farm s | diffusers `vae.decode` s | farm / diffusers | "
        "peak farm / diffusers GiB | farm's frames against diffusers' |"
    )
    yield "| --- | --- | --- | --- | --- | --- | --- | --- |"
    for _, r in items:
        latent = "×".join(str(s) for s in r["latent"])
        pixels = "×".join(str(s) for s in r["pixels"])
        frames = (
            "identical"
            if math.isinf(r["psnr_farm_vs_diffusers_db"])
            else f"{number(r['psnr_farm_vs_diffusers_db'])} dB, worst {number(r['worst_levels'], 0)} levels"
        )
        yield (
            f"| {r['decoder']} | {dtype_name(r['dtype'])} | {latent} → {pixels} | {number(r['farm_s'], 3)} | "
            f"{number(r['diffusers_s'], 3)} | {number(r['farm_over_diffusers'], 2)}× | "
            f"{number(r['farm_peak_gib'], 2)} / {number(r['diffusers_peak_gib'], 2)} | {frames} |"
        )
    if items:
        r = items[0][1]
        yield ""
        yield (
            f"{r['device_name']}, torch {r['torch']}, {r['date']}; RANDOM weights, median of {r['reps']} "
            f"alternated calls a side after one untimed call; peak: {r['peak_measure']}."
        )


def cold_rows(items: list[tuple[str, dict[str, Any]]]) -> Iterator[str]:
    yield "| row (wall, fresh process) | plain diffusers script | farm | farm / plain |"
    yield "| --- | --- | --- | --- |"
    for _, r in items:
        runs: dict[str, dict[int, dict[str, Any]]] = {"plain": {}, "farm": {}}
        for row_name, row in r["rows"].items():
            m = re.fullmatch(r"(plain|farm render \(own cluster\)), one shot #(\d+)", row_name)
            if m:
                runs["plain" if m[1] == "plain" else "farm"][int(m[2])] = row
        pairs = sorted(set(runs["plain"]) & set(runs["farm"]))
        if not pairs:
            continue

        def wall(row: dict[str, Any]) -> str:
            return number(row["wall_s"], 2) + ("" if row["rc"] == 0 else f" (rc {row['rc']})")

        ok = [k for k in pairs if runs["plain"][k]["rc"] == 0 and runs["farm"][k]["rc"] == 0]
        ratios = [runs["farm"][k]["wall_s"] / runs["plain"][k]["wall_s"] for k in ok]
        shot = "×".join(str(s) for s in r["shape"])
        yield (
            f"| one {shot} shot, `farm render` with its own cluster ({len(pairs)} runs a side, alternated) | "
            f"{', '.join(wall(runs['plain'][k]) for k in pairs)} | "
            f"{', '.join(wall(runs['farm'][k]) for k in pairs)} | "
            f"{', '.join(number(x, 2) for x in ratios)} |"
        )
        if ratios:
            plain = [runs["plain"][k]["wall_s"] for k in ok]
            farm = [runs["farm"][k]["wall_s"] for k in ok]
            yield ""
            yield (
                f"Headline: **{number(min(ratios), 2)}-{number(max(ratios), 2)}×** the script's wall "
                f"(median {number(statistics.median(ratios), 2)}; "
                f"farm {number(min(farm))}-{number(max(farm))} s "
                f"against {number(min(plain))}-{number(max(plain))} s), {r['decoder']}"
            )


def fold(paths: list[Path]) -> str:
    results, index = read_results(paths)
    kinds: dict[str, list[tuple[str, dict[str, Any]]]] = {
        k: [] for k in ("halo", "context", "seamless", "decode", "cold", "rounds")
    }
    problems = [line.strip() for line in index if "skipped" in line or re.search(r"rc [1-9]", line)]
    for name, r in results:
        if r.get("mode") in ("halo", "context") and "rows" in r:
            kinds[r["mode"]].append((name, r))
            bad = [str(row["value"]) for row in r["rows"] if has_nan(row)]
            if bad:
                problems.append(f"{name}: NaN at {', '.join(bad)} (no figure: the decode overflowed)")
        elif "whole_seconds" in r and isinstance(r.get("rows"), list):  # measure_groupnorm_rounds.py
            kinds["rounds"].append((name, r))
            bad = [str(row["halo"]) for row in r["rows"] if has_nan(row)]
            if bad:
                problems.append(f"{name}: NaN at halo {', '.join(bad)} (no figure: the decode overflowed)")
        elif "tiled_render_s" in r:
            kinds["seamless"].append((name, r))
        elif "farm_over_diffusers" in r:
            kinds["decode"].append((name, r))
        elif isinstance(r.get("rows"), dict) and "shape" in r:
            kinds["cold"].append((name, r))
    sections = [
        ("halo", "docs/fidelity.md, Halo: tiles equal to the untiled decode (table rows)", halo_rows),
        ("context", "docs/fidelity.md, temporal context (table rows, then the sentence form)", context_rows),
        ("seamless", "docs/fidelity.md, Through `farm render`, as users run it (table rows)", seamless_rows),
        ("rounds", "docs/fidelity.md, Statistics rounds (table rows)", rounds_rows),
        ("decode", "docs/decoders.md, Decode time per family (table)", decode_rows),
        (
            "cold",
            "docs/performance.md, The real path: weights from files, a fresh command (cold one shot)",
            cold_rows,
        ),
    ]
    out = []
    if problems:
        out += ["## Skipped or failed (no rows)", "", *[f"- {p}" for p in problems], ""]
    for kind, title, rows in sections:
        if kinds[kind]:
            items = sorted(kinds[kind], key=lambda item: item[0])
            sources = "; ".join(f"`{name}`" for name, _ in items)
            out += [f"## {title}", "", *rows(items), "", f"From (in row order): {sources}.", ""]
    missing = [kind for kind, _, _ in sections if not kinds[kind]]
    if missing:
        out += [f"No results of: {', '.join(missing)}.", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+", type=Path, help="callN.tar.gz, result folders or JSON files")
    parser.add_argument("--out-md", type=Path, default=None)
    args = parser.parse_args(argv)
    text = fold(args.paths)
    print(text)
    if args.out_md:
        args.out_md.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
