"""Helpers shared by the tests and the benchmark: real servers to test against."""
