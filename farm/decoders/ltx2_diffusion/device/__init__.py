"""Decode code that runs on a device and needs torch (and Triton) when it is imported: the LTX-2.5 diffusion
decoder's stage-by-stage decode in runs of frames (`ltx2_diffusion_chunked`) and its fused neighbourhood
attention kernel (`na_triton`).

The adapters in `farm.decoders` import these modules inside the functions that decode, so the driver, the
planner and the pure packages never load torch (`tests/test_layers.py`).
"""
