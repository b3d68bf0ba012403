"""A job as the store keeps it: JSON-safe, and read back as it was, whatever its state."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
import json

import pytest

from custom_components.llm_lanes.jobs.model import (
    Job,
    JobAnswer,
    JobSpec,
    JobStatus,
    WaitReason,
)
from custom_components.llm_lanes.jobs.prompts import text_prompt
from tests.jobs.support import local_time

CREATED = local_time(29, 23)


def _new() -> Job:
    return Job.from_spec(
        "abc",
        JobSpec(
            prompt=text_prompt("The door opened twice.", "Be brief.", 16384),
            name="digest",
            user_id="user-1",
            max_output_tokens=200,
            notify_target="notify.phone",
        ),
        CREATED,
    )


def _waiting() -> Job:
    job = _new()
    job.start(CREATED + timedelta(hours=2))
    job.interrupt()
    job.last_error = "server busy"
    job.wait_reason = WaitReason.RETRY_BACKOFF
    job.not_before = CREATED + timedelta(hours=3)
    return job


def _done() -> Job:
    job = _new()
    job.start(CREATED + timedelta(hours=2))
    job.record(JobAnswer("Quiet night.", 20, 3, "server", 0.25))
    job.finish(JobStatus.DONE, CREATED + timedelta(hours=2, seconds=5))
    return job


@pytest.mark.parametrize("make", [_new, _waiting, _done])
def test_a_stored_job_reads_back_as_it_was(make: Callable[[], Job]) -> None:
    """Times, statuses and wait reasons survive the JSON the store writes; None stays None."""
    job = make()
    stored = json.loads(json.dumps(job.as_stored()))
    assert Job.from_stored(stored) == job
