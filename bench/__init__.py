"""Benchmarks: ``python -m bench [part ...]`` (``make bench``). Results go to ``bench/results/``."""
