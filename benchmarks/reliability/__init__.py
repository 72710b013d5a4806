"""The trust boundaries under load: generated bodies, overload, aborted streams, a hostile template.

`python -m benchmarks.reliability` writes benchmarks/results/reliability.{json,md}.
"""
