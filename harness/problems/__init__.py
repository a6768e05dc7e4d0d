"""Problems: loading one (this suite's modules or a ParallelKernelBench checkout), the registry of
names, and validating a problem's reference against its oracle.

May import: common, emulation, launch, records.
"""
