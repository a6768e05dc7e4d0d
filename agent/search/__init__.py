"""`pkb search`: a kernel search per problem that learns from every kernel it has tried (docs/search.md).

One module per concern, pointing down (loop -> proposer, scoring, strategies, budget, stopping -> archive):

    config      what a search asks for (strategies, budgets, stop rules, window), stored in search.json
    layout      the run folder and its header
    archive     the SQLite archive: every candidate, decision, stop, migration, rescore, session
    strategies  parent selection (independent, best_first, islands; weighted by speedup and diversity)
    budget      what was spent, which limit that reaches, which problem gets the next candidate
    stopping    why a problem or the search stops
    proposer    the prompt of one candidate and the model call
    scoring     the harness side: the roofline bound, one evaluation, a re-measurement (agent.remeasure), what
                the archive keeps of them
    loop        decide, propose, evaluate, record; overlap; resume; the re-measurement of the top kernels
    summary     what the archive says so far (per problem, over time, throughput)
    live        the terminal table and the self-refreshing HTML page
    report      the morning report (`pkb report RUN` on a search run)
    rescore     `pkb rescore RUN` on a search run: each problem's reported kernel re-measured once more
    mutator     the stochastic scripted model (edits of real kernels, failures mixed in)
    tunables    the tunable sites of a kernel's source
    cpu_kernels CPU-runnable kernel families the scripted model edits on CPU
"""
