"""Benchmarks: hango-worker side by side with LangChain and pgqueuer (`make bench`).

`python -m bench.run [--quick]` writes bench/results/<date>.json;
`python -m bench.report` turns it into docs/benchmarks.md and its plot.
"""
