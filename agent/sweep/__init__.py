"""`pkb sweep SWEEP.toml`: models x conditions x seeds (and searches) as one resumable thing (docs/sweep.md).

    spec     the sweep file: its schema, its checks, the matrix of cells it expands to
    layout   the sweep's folder: sweep.json (the matrix), state.json (cells done), cells/<id>/ (each a run)
    plan     the dry run's budget ceiling: what the matrix may spend at most, from the budgets
    report   a sweep's runs for `pkb report`, each model's cells pooled over seeds

Running the cells is the CLI's (agent.cli.sweep_session): every run cell goes through `pkb run`'s own session
code (agent.cli.run_session) and every search cell through `pkb search`'s, so a cell is exactly the run that
command would make, resumes as it would, and stops on Ctrl-C as it would.
"""
