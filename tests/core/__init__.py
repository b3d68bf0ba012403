"""Tests of the engine (no Home Assistant)."""
