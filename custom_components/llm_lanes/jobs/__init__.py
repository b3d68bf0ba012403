"""Nightly summarization jobs: queued, persisted, windowed and throttled.

A job is a background-lane request that may wait hours for its turn (see ``manager``):

- ``model``: a job, its status, why it waits, and the errors the actions show about it;
- ``store``: the ``Store`` document jobs live in between restarts (one layout, version 1);
- ``prompts``: the prompt of a job, from text or the recorder's history, cut to the context limit;
- ``throttles``: the run window, the night's ledger and budget, the token bucket, a busy house;
- ``run``: one run of a job through the scheduler;
- ``delivery``: the summary-ready event, notify targets, persistent notifications;
- ``queue``: the jobs an entry keeps (and for how long), the night's ledger and the pause, stored;
- ``waiters``: the callers waiting for a job, and the entities following the jobs;
- ``manager``: the ``JobManager`` of one config entry, which ties them together.
"""
