"""Benchmarks (``make bench`` / ``python -m bench``); speed is measured here, never asserted in tests."""
