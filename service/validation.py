"""The formatter of pydantic validation errors now lives in :mod:`watermark.validation`
(the key store shares it and may import only ``watermark``). This name stays for the vLLM
engine's profile modules, which import it from here; new code imports
:mod:`watermark.validation`."""

from watermark.validation import describe, error_lines, first_error, summary

__all__ = ["describe", "error_lines", "first_error", "summary"]
