"""Exporters: a merged run written in other tools' formats (``distprof export``). No torch."""

from .kineto import ExportedFile, export_kineto

__all__ = ["ExportedFile", "export_kineto"]
