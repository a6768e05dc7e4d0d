"""The scoring engine. Kept import-light: the per-rank worker imports modules from here with torch and
the standard library only (no pydantic, no rich).

May import: problems.
"""
