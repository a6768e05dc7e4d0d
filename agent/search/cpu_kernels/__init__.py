"""CPU-runnable kernel families for the search's tests and CPU benchmarks: candidate files, not modules.

Each file is a candidate for one problem (`<problem>__<variant>.py`, like problems/*/solutions/), written
the way a first draft would be: correct, with tunables annotated `NAME = value  # tunable: v1, v2, ...`
whose values really change the CPU time (copy and reduction granularity, how long a waiting rank sleeps).
Ranks exchange data through a file in /dev/shm that every rank maps (torch.from_file, MAP_SHARED) on the
first call and that rank 0 unlinks at once: the CPU stand-in for symmetric memory. After the first call
no torch.distributed call is made; ranks meet at epoch flags in the shared mapping, double-buffered by
call parity as the GPU experts do, so one barrier per exchange suffices.

The stochastic scripted model (agent.search.mutator) edits these files on CPU, and the expert solutions
on GPUs; nothing imports them. The shared-mapping setup and the epoch barrier are repeated in every
file on purpose: a candidate is judged as one self-contained file in its sandbox, and the mutator edits
each file whole, so a helper module would be code the candidate depends on but does not own.
"""
