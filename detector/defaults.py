"""Defaults a caller may show before it loads the detector (the CLI's ``--help``)."""

DEFAULT_THRESHOLD = 1e-6
"""p-value at or below which a text is reported watermarked."""
