"""Tests of the nightly jobs: the manager on a scripted scheduler, prompts, entities, reloads."""
