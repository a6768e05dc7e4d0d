"""One evaluation's phases, each a module over one immutable context (context.py) and one record the
phases fill in (record.py); harness/evaluate.py runs them in order:

    prepare     what is decided before anything runs: the integrity checks, what this machine cannot run
    build       the compile stage's outcome and the static scan, into the record
    pools       the reference's pool and the candidate's sandboxed pool: started, and ended whatever happens
    reference   the reference side: trials drawn, timing sets made, the reference timed (or read from the
                cache), the timing phase's plan drawn from the secret
    load        the candidate loaded on every rank
    check       the correctness trials, every output judged here
    timing      the candidate timed one request per iteration, then its kept outputs judged (timed_outputs)
    reconcile   the timing claims against this process's clock, input caching, the roofline bound
    asking      one request to the candidate's ranks, and what its replies say beyond data
    stop        how a phase ends the evaluation with a failure

May import: common, compiling, config, emulation, judge, launch, measure, problems, rank, records.
"""
