"""Lightricks' LTX-2 HDR post-processing, vendored as a test reference: see README.md here."""
