"""HunyuanVideo 1.5's middle-block attention in blocks of query rows
(`hunyuanvideo15.device.chunked_attention`) computes what diffusers' ``HunyuanVideo15AttnBlock`` computes,
and every HunyuanVideo 1.5 model farm loads uses it (torch's efficient kernel is wrong with a mask past 2^32
scores, pytorch/pytorch#187227: a GPU only; here the limit per call is lowered so that several blocks
run on a CPU).
"""

from __future__ import annotations

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

from farm.decoders import FAMILIES, chunked_sdpa
from farm.decoders.hunyuanvideo15.device.chunked_attention import (
    ChunkedHunyuanVideo15AttnBlock,
    causal_mask_rows,
)
from farm.inputs.synthetic import synth_spec
from tests.helpers import save_weights

pytestmark = pytest.mark.model


def sdpa_rows(monkeypatch) -> list[int]:
    """The query rows of each SDPA call from now on."""
    import torch.nn.functional as F

    rows: list[int] = []
    sdpa = F.scaled_dot_product_attention

    def counted(query, *args, **kwargs):
        rows.append(query.shape[-2])
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    return rows


def test_mask_rows_are_diffusers_causal_mask():
    want = HunyuanVideo15AttnBlock.prepare_causal_attention_mask(3, 6, torch.bfloat16, "cpu")
    got = causal_mask_rows(range(4, 15), 6, 18, torch.bfloat16, "cpu")
    assert got.dtype == want.dtype and torch.equal(got, want[4:15])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_block_equals_diffusers_block(monkeypatch, dtype):
    torch.manual_seed(3)
    block = HunyuanVideo15AttnBlock(16).eval().to(dtype)
    x = torch.randn(1, 16, 3, 5, 6, generator=torch.Generator().manual_seed(4)).to(dtype)
    with torch.inference_mode():
        want = block(x)
        monkeypatch.setattr(chunked_sdpa, "MAX_SCORES_PER_CALL", 8 * 90)  # 90 positions: 12 blocks
        calls = sdpa_rows(monkeypatch)
        block.__class__ = ChunkedHunyuanVideo15AttnBlock
        got = block(x)
    assert calls == [8] * 11 + [2]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 if dtype == torch.float32 else 0)


@pytest.mark.parametrize("weights", ["random", "file"])
def test_loaded_hunyuanvideo15_decodes_as_diffusers_chunked(tmp_path, monkeypatch, weights):
    cls = FAMILIES["hunyuanvideo15"]
    reference = cls.build(synth_spec("hunyuanvideo15-tiny", seed=2))
    reference.use_tiling = False
    path = str(save_weights(reference, tmp_path, "file")) if weights == "file" else None
    decoder = cls.load(cls.check_weights(synth_spec("hunyuanvideo15-tiny", seed=2, weights=path)), "cpu")
    attentions = decoder.model.decoder.mid_block.attentions
    assert all(isinstance(a, ChunkedHunyuanVideo15AttnBlock) for a in attentions)
    assert type(reference.decoder.mid_block.attentions[0]) is HunyuanVideo15AttnBlock

    latent = torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(8))
    monkeypatch.setattr(chunked_sdpa, "MAX_SCORES_PER_CALL", 10 * 72)  # 72 positions: 8 blocks
    with torch.inference_mode():
        want = reference.decode(latent, return_dict=False)[0]
        calls = sdpa_rows(monkeypatch)
        got = decoder.model.decode(latent, return_dict=False)[0]
    assert calls == [10] * 7 + [2]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
