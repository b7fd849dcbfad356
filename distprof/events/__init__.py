"""Event semantics shared by capture and import: classification (classify.py) and shard tables (tables.py)."""
