"""The reader wing: every input format, read into `RawRecord`s (a payload and its kind) and
`Quarantined` entries, under bounded memory and time (quipu.tasks.reading.inputs's docstring says
what costs what). One module per format, one row per format in the format table
(quipu.tasks.reading.formats); the PDF reader (pdf, pdf_layout, pdf_ranges) and the HTML text
extractor (html_text) that stage extract's extractor table runs live here too.

What other code uses is importable from here (`from quipu.tasks.reading import read, expand_inputs`),
loaded on first use: the PDF and HTML child processes import their one module of this package,
not the whole wing (pyarrow, the driver).
"""
from __future__ import annotations

import importlib

_HOMES = {
    "files": ("FileSlice", "file_problem", "file_size", "local_path", "source_name"),
    "formats": ("FOLDER_SUFFIXES", "FORMATS", "SUPPORTED", "Format", "format_of", "reader_kind"),
    "inputs": ("expand_inputs", "plan_slices", "read"),
    "records": ("TOO_LARGE_PREFIX_BYTES", "Quarantined", "RawRecord", "ReadLimits", "ReadStats", "stable_id"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value
