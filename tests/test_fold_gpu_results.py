"""`benchmarks/fold_gpu_results.py`: the result files of the GPU calls folded into the docs' rows.

The halo and decode results are written by the real scripts (`measure_halo.py`, `bench_family_decode.py`,
tiny configs on the CPU), so a change of their JSON that the folding does not follow fails here; the
render benchmarks' results (a cluster each) are written in their scripts' format by hand.
"""

from __future__ import annotations

import importlib.util
import json
import math
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cell(row: dict) -> str:
    band = "∞" if math.isinf(row["band_psnr_db"]) else f"{row['band_psnr_db']:.1f}"
    return f"{band} / {row['worst_levels']:.0f}"


def table_line(text: str, label: str) -> list[str]:
    """The cells of the one markdown row whose first cell starts with `label`."""
    lines = [line for line in text.splitlines() if line.startswith(f"| {label}")]
    assert len(lines) == 1, text
    return [c.strip() for c in lines[0].strip("|").split("|")]


@pytest.fixture(scope="module")
def call_archive(tmp_path_factory) -> tuple[Path, dict, dict]:
    """A call's archive as `gpu_pending.sh` packs it: a halo sweep, a family decode, an index with a
    skipped and a failed step."""
    root = tmp_path_factory.mktemp("results")
    call = root / "call2"
    call.mkdir()
    halo_json, decode_json = call / "halo-ltx2-tiny.json", call / "decode-cosmos.json"
    assert (
        script("measure_halo").main(
            [
                "halo",
                "--decoder",
                "ltx2-tiny",
                "--shape",
                "3,8,8",
                "--halos",
                "2,3,6",
                "--out-json",
                str(halo_json),
            ]
        )
        == 0
    )
    assert (
        script("bench_family_decode").main(
            ["--decoder", "cosmos-tiny", "--shape", "3,8,8", "--reps", "1", "--out-json", str(decode_json)]
        )
        == 0
    )
    (call / "index.txt").write_text(
        "# call2 on cpu\n== halo-ltx2-tiny 00:00:00, limit 90 s: ...\n   halo-ltx2-tiny: rc 0, 9 s\n"
        "== halo-mochi-bf16 00:00:09, limit 90 s: ...\n   halo-mochi-bf16: rc 124, 90 s\n"
        "== decode-mochi skipped: 12 s left of the call's 480 s\n"
    )
    archive = root / "call2.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(call, arcname="call2")
    return archive, json.loads(halo_json.read_text()), json.loads(decode_json.read_text())


def test_halo_sweep_folds_into_the_halo_table_row(call_archive) -> None:
    archive, halo, _ = call_archive
    text = script("fold_gpu_results").fold([archive])
    cells = table_line(text, "ltx2-tiny float32")
    by_value = {row["value"]: row for row in halo["rows"]}
    assert cells[0].startswith("ltx2-tiny float32 17×256×256")  # the pixels of latent 3×8×8
    assert f"halo 3: {cell(by_value[3])}" in cells[0]  # a value without a column of its own
    for column, value in ((1, 2), (3, 6)):  # the columns of halo 2 and 6
        expected = cell(by_value[value])
        assert cells[column] == (f"**{expected}**" if halo["least"] == value else expected)
    assert cells[2] == cells[4] == ""  # halo 4 and 8: not swept
    assert cells[7] == (str(halo["least"]) if halo["least"] is not None else "not reached")
    assert cells[8] == "no"  # ltx2-tiny's halo is exact: no blend beside it
    assert "From (in row order): `call2/halo-ltx2-tiny.json`." in text


def test_the_tiles_and_the_whole_decode_measured_from_float32_fold_beside_the_dtype_noise(tmp_path) -> None:
    call = tmp_path / "call1"
    call.mkdir()
    out = call / "halo-noise.json"
    args = ["halo", "--decoder", "ltx2-tiny", "--dtype", "bfloat16", "--shape", "3,8,8", "--halos", "2,7",
            "--dtype-noise", "--out-json", str(out)]  # fmt: skip
    assert script("measure_halo").main(args) == 0
    result = json.loads(out.read_text())
    noise, *sweep = result["rows"]
    assert noise["value"] == "whole vs float32"
    for row in sweep:  # each row's tiles and the whole decode, each from the float32 decode
        tiled, whole = row["float32"]["tiled"], row["float32"]["whole"]
        assert whole["psnr_db"] == pytest.approx(noise["psnr_db"])
        assert row["float32"]["as_close"] == (tiled["band_psnr_db"] >= whole["band_psnr_db"] - 0.5)
    exact = next(row for row in sweep if row["value"] == 7)  # ltx2-tiny's halo of 7 is exact: the tiles are
    assert exact["float32"]["as_close"]  # as close to float32 as the whole decode
    assert not next(row for row in sweep if row["value"] == 2)["float32"]["as_close"]
    (call / "index.txt").write_text("# call1 on cpu\n")
    archive = tmp_path / "call1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(call, arcname="call1")
    text = script("fold_gpu_results").fold([archive])
    label = table_line(text, "ltx2-tiny bf16")[0]
    tiled = exact["float32"]["tiled"]["band_psnr_db"]
    assert result["least"] == 7
    assert f"its tiles at 7 {tiled:.1f} dB from it over the seams" in label, label


def test_statistics_rounds_fold_into_their_table_with_the_float32_figures(tmp_path) -> None:
    out = tmp_path / "rounds-hunyuan-noise.json"
    args = ["--decoder", "hunyuanvideo-tiny", "--dtype", "bfloat16", "--shape", "3,24,24", "--halos", "8",
            "--dtype-noise", "--out-json", str(out)]  # fmt: skip
    assert script("measure_groupnorm_rounds").main(args) == 0
    row = json.loads(out.read_text())["rows"][0]
    text = script("fold_gpu_results").fold([out])
    cells = table_line(text, "hunyuanvideo-tiny bf16")
    assert cells[0] == "hunyuanvideo-tiny bf16 9×192×192, 1×2×2" and cells[1] == "8"
    assert cells[2] == f"{row['psnr_db']:.1f} / {row['band_psnr_db']:.1f} dB"
    tiled, whole = row["float32"]["tiled"]["band_psnr_db"], row["float32"]["whole"]["band_psnr_db"]
    assert cells[-1] == f"{tiled:.1f} / {whole:.1f} dB"
    assert "From (in row order): `rounds-hunyuan-noise.json`." in text


def test_family_decode_folds_into_the_decoders_table(call_archive) -> None:
    archive, _, decode = call_archive
    text = script("fold_gpu_results").fold([archive])
    cells = table_line(text, "cosmos-tiny")
    assert cells[:3] == ["cosmos-tiny", "float32", "3×8×8 → 17×64×64"]
    assert cells[3] == f"{decode['farm_s']:.3f}" and cells[4] == f"{decode['diffusers_s']:.3f}"
    assert cells[5] == f"{decode['farm_over_diffusers']:.2f}×"
    assert math.isinf(decode["psnr_farm_vs_diffusers_db"]) and cells[7] == "identical"


def test_skipped_and_failed_steps_come_first(call_archive, tmp_path) -> None:
    archive, _, _ = call_archive
    text = script("fold_gpu_results").fold([archive])
    first = text.split("\n## ")[0]
    assert "decode-mochi skipped: 12 s left" in first and "halo-mochi-bf16: rc 124" in first
    assert "halo-ltx2-tiny: rc 0" not in first
    assert "No results of: context, seamless, rounds, cold." in text


def test_nan_rows_are_listed_not_folded_as_figures(tmp_path) -> None:
    result = {
        "mode": "halo",
        "decoder": "hunyuanvideo-tiny",
        "dtype": "bfloat16",
        "shape": [3, 8, 8],
        "grid": [1, 2, 2],
        "whole_frame": False,
        "least": None,
        "rows": [
            {
                "value": 8,
                "psnr_db": math.nan,
                "band_psnr_db": math.nan,
                "worst_levels": 0.0,
                "redundancy": 1.5,
                "seconds": 1.0,
                "floor": False,
            }
        ],
    }
    path = tmp_path / "halo-hunyuan.json"
    path.write_text(json.dumps(result))
    text = script("fold_gpu_results").fold([path])
    assert "halo-hunyuan.json: NaN at 8" in text.split("\n## ")[0]
    assert table_line(text, "hunyuanvideo-tiny bf16")[4] == "NaN / 0"


def test_cold_start_pairs_and_headline(tmp_path) -> None:
    walls = {1: (20.0, 25.0, 0), 2: (21.0, 23.1, 0), 3: (19.0, 300.0, 124)}  # plain, farm, farm's rc
    rows = {}
    for k, (plain, farm, rc) in walls.items():
        rows[f"plain, one shot #{k}"] = {"wall_s": plain, "rc": 0}
        rows[f"farm render (own cluster), one shot #{k}"] = {"wall_s": farm, "rc": rc}
    folder = tmp_path / "call3" / "real-path"
    folder.mkdir(parents=True)
    (folder / "real_path.json").write_text(
        json.dumps({"decoder": "ltx2", "shape": [121, 704, 1216], "rows": rows})
    )
    text = script("fold_gpu_results").fold([tmp_path])
    cells = table_line(text, "one 121×704×1216 shot")
    assert cells[0].startswith("one 121×704×1216 shot") and "3 runs a side" in cells[0]
    assert cells[1] == "20.00, 21.00, 19.00" and cells[2] == "25.00, 23.10, 300.00 (rc 124)"
    assert cells[3] == "1.25, 1.10"  # the failed pair has no ratio
    assert "**1.10-1.25×**" in text and "median 1.18" in text


def test_seamless_render_row(tmp_path) -> None:
    result = {
        "decoder": "ltx2-diffusion",
        "dtype": "bfloat16",
        "shape": [121, 1088, 1920],
        "gpu_memory": "24GiB",
        "grid": [1, 1, 2],
        "overlap": [0, 0, 0],
        "halo": 8,
        "redundancy": 1.274,
        "whole_render_s": 40.04,
        "tiled_render_s": 45.96,
        "nvidia_smi_peak_gib": 23.71,
        "budget_gib": 24.0,
        "psnr_db": 51.234,
        "band_psnr_db": 50.01,
        "psnr_float16_db": 53.3,
        "worst_levels": 5.0,
    }
    path = tmp_path / "seamless.json"
    path.write_text(json.dumps(result))
    cells = table_line(script("fold_gpu_results").fold([path]), "ltx2-diffusion bf16")
    assert cells[:4] == [
        "ltx2-diffusion bf16, 121×1088×1920",
        "24GiB",
        "1×1×2, halo 8, no blend",
        "1.27×",
    ]
    assert (
        cells[4] == "51.2 / 50.0 dB (float16 53.3 dB)"
        and cells[6] == "23.7 GiB"
        and cells[7] == "40.0 / 46.0 s"
    )

    # the float16 band and worst pixel, where the benchmark measured them
    path.write_text(json.dumps({**result, "band_psnr_float16_db": 52.04, "worst_float16_levels": 3.27}))
    cells = table_line(script("fold_gpu_results").fold([path]), "ltx2-diffusion bf16")
    assert cells[4] == "51.2 / 50.0 dB (float16 53.3 / 52.0 dB)" and cells[5] == "5 levels (float16 3.3)"
