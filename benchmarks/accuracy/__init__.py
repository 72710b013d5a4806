"""Pieces of benchmarks/predictor_accuracy.py: folds, cross-validation, scoring and paired tests, metrics, method variants, the TF-IDF baseline, overhead, report."""
