"""The command-line shell: the subcommands of `python -m evaluator` (one module per group:
tasks_cmd, run_cmd, check_cmd, estimate_cmd, tune_cmd; main builds the parser) and the shared
options (cli.options: --suite, --ray, --cache, ...) that data_gen and training reuse.

The shell sits above the grading core and the peer suites: it imports evaluator and suites,
and neither imports it."""
