"""The run report: the metrics of one or more runs as JSON, markdown, or one self-contained HTML file.

- .run_reader: a run directory (docs/run-layout.md) read into typed records;
- .metrics: pass@k, fast_p@k, bootstrap intervals, speedups, failures and usage over sample records (pure);
- .accounting: which asked problems each arm judged and which it left out (and why), and what speed was not
  measured (pure); .summary: the same as lines for the end of `pkb run`;
- .build: every number of the report, computed once (what `--format json` prints);
- .rows: the tables as text, shared by .markdown and .html; .figures: the plots (matplotlib);
- .markdown, .html (with report.css): the two layouts.

`pkb report` (agent.cli.report) is the command; `pkb run`'s summary counts what is fast with .metrics.
"""
