"""HunyuanVideo's middle-block attention in blocks of query rows (`chunked_attention`) computes what
diffusers' default processor computes, and every HunyuanVideo model farm loads uses it.

torch's memory-efficient SDPA kernel is wrong with an explicit mask past 2^32 scores (pytorch/pytorch#187227),
which only a GPU shows; here the limit per call is lowered so that several blocks run on a CPU.
"""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import Attention, AttnProcessor2_0
from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import prepare_causal_attention_mask

from farm.decoders import FAMILIES, chunked_sdpa
from farm.decoders.hunyuanvideo.chunked_attention import ChunkedMaskAttnProcessor
from farm.inputs.synthetic import synth_spec
from tests.helpers import save_weights

pytestmark = pytest.mark.model

FRAMES, HW = 3, 6 * 5  # 90 positions: a few frames of a small latent


def mid_block_attention(dtype: torch.dtype, channels: int = 32) -> Attention:
    """An ``Attention`` built as HunyuanVideo's middle block builds it (one head, group norm, residual)."""
    torch.manual_seed(3)
    attn = Attention(channels, heads=1, dim_head=channels, eps=1e-6, norm_num_groups=8,
                     residual_connection=True, bias=True, upcast_softmax=True,
                     _from_deprecated_attn_block=True)  # fmt: skip
    return attn.eval().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_processor_equals_diffusers_default_with_the_causal_mask(monkeypatch, dtype):
    attn = mid_block_attention(dtype)
    hidden = torch.randn(2, FRAMES * HW, 32, generator=torch.Generator().manual_seed(4)).to(dtype)
    mask = prepare_causal_attention_mask(FRAMES, HW, dtype, hidden.device, batch_size=2)
    with torch.inference_mode():
        attn.set_processor(AttnProcessor2_0())
        want = attn(hidden, attention_mask=mask)
        monkeypatch.setattr(chunked_sdpa, "MAX_SCORES_PER_CALL", 7 * FRAMES * HW)  # 13 blocks of 7 rows
        calls = count_sdpa_calls(monkeypatch)
        attn.set_processor(ChunkedMaskAttnProcessor())
        got = attn(hidden, attention_mask=mask)
    assert calls == [7] * 12 + [6]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 if dtype == torch.float32 else 0)


def count_sdpa_calls(monkeypatch) -> list[int]:
    """The query rows of each SDPA call from now on."""
    import torch.nn.functional as F

    rows: list[int] = []
    sdpa = F.scaled_dot_product_attention

    def counted(query, *args, **kwargs):
        rows.append(query.shape[-2])
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    return rows


def test_chunked_sdpa_keeps_each_call_below_the_limit_and_equals_one_call(monkeypatch):
    generator = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 50, 8, generator=generator) for _ in range(3))
    mask = torch.where(torch.rand(50, 50, generator=generator) < 0.3, float("-inf"), 0.0)
    mask.fill_diagonal_(0.0)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    monkeypatch.setattr(chunked_sdpa, "MAX_SCORES_PER_CALL", 50 * 16 + 3)
    calls = count_sdpa_calls(monkeypatch)
    got = chunked_sdpa.chunked_sdpa(q, k, v, mask)
    assert calls == [16, 16, 16, 2]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("weights", ["random", "file"])
def test_loaded_hunyuanvideo_decodes_as_diffusers_with_the_chunked_attention(tmp_path, monkeypatch, weights):
    cls = FAMILIES["hunyuanvideo"]
    source_spec = synth_spec("hunyuanvideo-tiny", seed=2)
    reference = cls.build(source_spec)
    reference.use_framewise_decoding = False  # the untiled decode, as farm decodes a tile
    path = str(save_weights(reference, tmp_path, "file")) if weights == "file" else None
    spec = cls.check_weights(synth_spec("hunyuanvideo-tiny", seed=2, weights=path))
    decoder = cls.load(spec, "cpu")
    for attn in decoder.model.decoder.mid_block.attentions:
        assert isinstance(attn.processor, ChunkedMaskAttnProcessor)
    assert isinstance(reference.decoder.mid_block.attentions[0].processor, AttnProcessor2_0)

    latent = torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(8))
    positions = 3 * 4 * 6
    monkeypatch.setattr(chunked_sdpa, "MAX_SCORES_PER_CALL", 10 * positions)  # 8 blocks
    with torch.inference_mode():
        want = reference.decode(latent, return_dict=False)[0]
        calls = count_sdpa_calls(monkeypatch)
        got = decoder.model.decode(latent, return_dict=False)[0]
    assert calls == [10] * 7 + [2]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
