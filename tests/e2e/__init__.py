"""End-to-end browser tests: Chromium driving a real Home Assistant (``pytest -m e2e tests/e2e``)."""
