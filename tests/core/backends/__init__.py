"""Tests of the backend clients."""
