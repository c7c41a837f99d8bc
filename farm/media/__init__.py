"""The files people open: video segments and their lossless join, image sequences, a shot's sound, the
colour conversion for the encoder (`yuv`), frame rates and timecode, what a render writes (`settings`),
the editorial timeline (`timeline`, OUT/timeline.otio), and how any file is written so that none is seen
half-written (`files`, `names`).

May import: `farm.errors`, `farm.config`, numpy and PyAV (video, audio and images only), OpenTimelineIO
(inside `timeline`'s functions: it is optional); torch only inside the functions that take a worker's
tensors. Nothing of farm's other packages.
"""
