"""Scale benchmarks (issue 14): ours against a bare-Temporal floor; see ``python -m bench.scale --help``."""
