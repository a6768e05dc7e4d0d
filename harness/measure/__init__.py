"""What is measured beside the verdict: the reference's traffic (tracing), timelines and Nsight
(profiling, ncu, nsys), the machine (topology, calibration, hardware figures), the roofline.

May import: common, compiling, config, emulation, judge, launch, problems, rank, records.
"""
