"""Tests of the benchmark: simulator, scenarios, runner, reports and sweep."""
