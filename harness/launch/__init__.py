"""The trusted side of rank processes: starting a pool of W ranks (in the sandbox for candidates),
reading their replies as data, killing them, and the other contained helper processes.

May import: cancel, common, emulation, records.
"""
