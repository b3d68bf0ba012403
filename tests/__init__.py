"""Tests for LLM Lanes."""
