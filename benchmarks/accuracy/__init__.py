"""Pieces of benchmarks/predictor_accuracy.py: metrics, method variants, overhead, report."""
