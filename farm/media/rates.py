"""Frame rates as exact rationals, and SMPTE timecode (pure: no I/O).

Broadcast rates are not decimals: NTSC's "23.976" is 24000/1001 and "29.97" is 30000/1001. A rate is
read from ``"24000/1001"``, an integer, or a decimal; a decimal within 0.005 of N·1000/1001 (23.976,
23.98, 29.97, 47.952, 59.94, 119.88) means that NTSC rate, any other decimal itself (12.5 → 25/2).

>>> parse_rate("23.976"), parse_rate("30000/1001"), parse_rate(25)
(Fraction(24000, 1001), Fraction(30000, 1001), Fraction(25, 1))
>>> rate_text(parse_rate("29.97"))
'30000/1001'

Timecode ``HH:MM:SS:FF`` counts frames at the nominal rate (30 for 29.97); ``HH:MM:SS;FF`` is
drop-frame, allowed at 30000/1001 and 60000/1001 only: frame labels 0 and 1 (0-3 at 59.94) are skipped
at the start of every minute not divisible by 10, so the label keeps up with the clock.

>>> frames_to_timecode(timecode_to_frames("00:00:59;29", parse_rate("29.97")) + 1, parse_rate("29.97"), True)
'00:01:00;02'
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from farm.errors import FarmError

MAX_RATE = 1000
# The slowest rate, and the largest numerator or denominator, a video's time base carries exactly (FFmpeg
# refuses 1/1000000000 and cannot mux 1000000007/1000000006; 999999/1000 and 120000/1001 are exact).
MIN_RATE = Fraction(1, 100)
MAX_TERM = 1_000_000
RANGE_TEXT = "from 1/100 to 1000, as a number or a ratio of whole numbers up to 1000000"
_NTSC_TOLERANCE = 0.005
_TIMECODE = re.compile(r"^(\d{1,2}):(\d{2}):(\d{2})([:;.,])(\d{2,3})$")


def parse_rate(value: Any, where: str = "--fps") -> Fraction:
    """A frame rate as an exact fraction (see the module doc); FarmError naming `where` otherwise."""
    if isinstance(value, Fraction):
        rate = value
    elif isinstance(value, bool):
        rate = Fraction(-1)
    else:
        text = str(value).strip()
        try:
            if "/" in text:
                num, den = text.split("/", 1)
                rate = Fraction(int(num), int(den))
            else:
                exact = Fraction(text)  # "23.976", "24", 23.976's repr
                rate = exact if exact.denominator == 1 else ntsc_rate(exact)
        except (ValueError, ZeroDivisionError, OverflowError):
            rate = Fraction(-1)
    if not 0 < rate <= MAX_RATE:
        raise FarmError(
            f"{where} {value!r} is invalid; give frames per second {RANGE_TEXT}: 24, 25, 24000/1001 "
            "(23.976), 30000/1001 (29.97)"
        )
    if rate < MIN_RATE or max(rate.numerator, rate.denominator) > MAX_TERM:
        raise FarmError(
            f"{where} {value!r} ({rate_text(rate)}) is beyond what a video's time base carries exactly; give "
            f"frames per second {RANGE_TEXT}: 24, 25, 24000/1001 (23.976), 30000/1001 (29.97)"
        )
    return rate


def ntsc_rate(decimal: Fraction) -> Fraction:
    """N·1000/1001 when `decimal` is within 0.005 of it (23.976 → 24000/1001), else `decimal` itself."""
    nominal = round(decimal * 1001 / 1000)
    ntsc = Fraction(nominal * 1000, 1001)
    return ntsc if nominal > 0 and abs(decimal - ntsc) < _NTSC_TOLERANCE else decimal


def rate_text(rate: Fraction) -> str:
    """``"24"`` or ``"24000/1001"``: how a rate is stored (attributes) and shown."""
    return str(rate.numerator) if rate.denominator == 1 else f"{rate.numerator}/{rate.denominator}"


def read_rate(attrs: dict[str, Any]) -> Fraction | None:
    """A stored shot's rate: its exact ``rate`` attribute where its ``fps`` number agrees (an ``fps``
    changed by hand wins; a decimal 23.976 reads as NTSC); None when the one that counts is not valid."""

    def valid(value: Any) -> Fraction | None:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        try:
            return parse_rate(value)
        except FarmError:
            return None

    exact = valid(attrs["rate"]) if "rate" in attrs else None
    if "fps" not in attrs:
        return exact
    number = valid(attrs["fps"])
    if number is None:
        return None
    agree = exact is not None and abs(float(exact) - float(attrs["fps"])) < 1e-6
    return exact if agree else number


def nominal_fps(rate: Fraction) -> int:
    """The frames per second a timecode counts: 30 for 30000/1001, 25 for 25."""
    return max(1, round(rate))


def drop_frames_per_minute(rate: Fraction) -> int:
    """Frame labels a drop-frame timecode skips per minute: 2 at 30000/1001, 4 at 60000/1001, else 0."""
    if rate.denominator == 1001 and rate.numerator in (30000, 60000):
        return rate.numerator // 15000
    return 0


def parse_timecode(text: str, rate: Fraction, where: str = "--timecode") -> str:
    """`text` checked against `rate` and written ``HH:MM:SS:FF`` (``;`` before FF when drop-frame)."""
    found = _TIMECODE.match(str(text).strip())
    nominal = nominal_fps(rate)
    if not found:
        raise FarmError(
            f"{where} {text!r} is invalid; give HH:MM:SS:FF (HH:MM:SS;FF drop-frame), e.g. 01:00:00:00"
        )
    h, m, s, sep, f = found.groups()
    hours, minutes, seconds, frame = int(h), int(m), int(s), int(f)
    drop = sep in ";,"
    if hours > 23 or minutes > 59 or seconds > 59 or frame >= nominal:
        raise FarmError(
            f"{where} {text!r} is invalid at {rate_text(rate)} fps: hours 0-23, minutes and seconds 0-59, "
            f"frames 0-{nominal - 1}"
        )
    skipped = drop_frames_per_minute(rate)
    if drop and not skipped:
        raise FarmError(
            f"{where} {text!r} is drop-frame (;), which only 30000/1001 (29.97) and 60000/1001 (59.94) fps "
            f"have; this shot runs at {rate_text(rate)}: write it HH:MM:SS:FF"
        )
    if drop and seconds == 0 and minutes % 10 and frame < skipped:
        raise FarmError(f"{where} {text!r} names a frame label drop-frame timecode skips (minute {minutes})")
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{';' if drop else ':'}{frame:02d}"


def is_drop_frame(timecode: str) -> bool:
    return ";" in timecode


def timecode_to_frames(timecode: str, rate: Fraction) -> int:
    """The frame count from 00:00:00:00 that a (checked) timecode labels."""
    found = _TIMECODE.match(timecode)
    assert found is not None, timecode
    h, m, s, _, f = (int(g) if g not in ":;.," else 0 for g in found.groups())
    nominal = nominal_fps(rate)
    frames = (h * 3600 + m * 60 + s) * nominal + f
    if is_drop_frame(timecode):
        total_minutes = 60 * h + m
        frames -= drop_frames_per_minute(rate) * (total_minutes - total_minutes // 10)
    return frames


def frames_to_timecode(frames: int, rate: Fraction, drop: bool) -> str:
    """The timecode of frame `frames` counted from 00:00:00:00 (wraps at 24 hours)."""
    nominal = nominal_fps(rate)
    skipped = drop_frames_per_minute(rate) if drop else 0
    if skipped:
        per_minute = nominal * 60 - skipped
        per_ten = per_minute * 10 + skipped
        tens, rest = divmod(frames, per_ten)
        frames += skipped * 9 * tens + (skipped * ((rest - skipped) // per_minute) if rest > skipped else 0)
    frames %= nominal * 86400
    seconds, frame = divmod(frames, nominal)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}{';' if skipped else ':'}{frame:02d}"


def timecode_at(start: str, rate: Fraction, offset: int) -> str:
    """The timecode `offset` frames after `start`, in `start`'s kind (drop-frame or not)."""
    drop = is_drop_frame(start)
    return frames_to_timecode(timecode_to_frames(start, rate) + offset, rate, drop)


def start_timecode(rate: Fraction | None, stored: str | None, override: str | None) -> str | None:
    """A shot's start timecode: the render's `override` (``--timecode``), else the job's `stored` one,
    checked against the shot's `rate`; None when neither is given (or the rate is not valid)."""
    given = override or stored
    if not given or rate is None:
        return None
    return parse_timecode(given, rate, where="--timecode" if override else "the shot's timecode")
