"""Importers: traces from other tools -> distprof shards (see kineto.py, run.py)."""
