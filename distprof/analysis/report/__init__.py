"""The report: ``build.build_report`` runs every analysis on a ``RunSummary``; ``schema`` names the format and makes
values plain JSON; ``diff`` compares two reports; ``watch`` summarises a ``--watch`` series.
"""
