"""The judge: every comparison, flag and verdict, computed in processes that never import candidate code.

May import: common, compiling, config, launch, problems, rank, records.
"""
