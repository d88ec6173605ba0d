"""Measured programs for the core issue's performance targets (not tests: nothing here asserts).

One module per benchmark, each runnable alone (``python -m benchmarks.burn_down --help``) and
printing one JSON line per run; ``python -m benchmarks.run_all`` (``make bench``) runs them all in
fresh processes and prints the table that ``benchmarks/README.md`` records.
"""
