"""The files people open: video segments and their lossless join, image sequences, a shot's sound, the
colour conversion for the encoder (`yuv`), colour spaces by OpenColorIO (`colour`), what HDR decodes
mean (`hdr`) and their HLG master (`hlg`), frame rates and timecode, what a render writes (`settings`),
the editorial timeline (`timeline`, OUT/timeline.otio), and how any file is written so that none is seen
half-written (`files`, `names`) and never through a link under OUT (`beneath`).

May import: `farm.errors`, `farm.config`, numpy, PyAV (video, audio and images only), OpenColorIO
(inside `colour`'s functions) and OpenTimelineIO (inside `timeline`'s functions): both are optional;
torch only inside the functions that take a worker's tensors. Nothing of farm's other packages.
"""
