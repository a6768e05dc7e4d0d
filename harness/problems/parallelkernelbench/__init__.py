"""The ParallelKernelBench source adapter: a checkout's references as problems of this harness.

ParallelKernelBench (PKB) is the benchmark this project follows; `--source pkb:PATH` points a command at a
checkout of it. Nothing of it is vendored:

- .checkout: the checkout's references as Problems, loader specs "pkb:<checkout>::<file>" the rank
  workers resolve, the checkout's `utils` made importable (worker-safe: standard library and torch);
- .inputs: which of a reference's inputs may be re-drawn per trial (worker-safe);
- .input_report: what the harness does to them, examined in the harness's own process; .input_probe is
  the child that draws them where the checkout's generator builds process groups;
- .solutions: which reference each file of a solution set solves (by name, never by number alone),
  with renames.json, the known renames between the checkout's commits.

Validating these problems (they have no oracle) is harness.validate's. docs/pkb.md says more.
"""
