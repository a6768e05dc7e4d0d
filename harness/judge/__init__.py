"""The judge: every comparison, flag and verdict, computed in processes that never import candidate code."""
