"""Where a finished job's summary goes: the event, a notify target, a persistent notification."""

from __future__ import annotations

from typing import Any

from homeassistant.components import persistent_notification
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
import probatio

from custom_components.llm_lanes.const import DOMAIN, EVENT_SUMMARY_READY, LOGGER
from custom_components.llm_lanes.error_translation import validation_error
from custom_components.llm_lanes.jobs.model import Job, iso_or_none


def summary_ready_event_data(entry_id: str, job: Job) -> dict[str, Any]:
    """Build the data of ``llm_lanes_summary_ready`` (the summary, never the prompt)."""
    return {
        "entry_id": entry_id,
        "job_id": job.id,
        "name": job.name,
        "requester": job.requester,
        "text": job.text or "",
        "prompt_tokens": job.prompt_tokens,
        "output_tokens": job.output_tokens,
        "token_source": job.token_source,
        "created_at": iso_or_none(job.created_at),
        "started_at": iso_or_none(job.started_at),
        "finished_at": iso_or_none(job.finished_at),
        "wait_s": job.wait_s,
        "duration_s": job.duration_s,
        "ttft_s": job.ttft_s,
        "attempts": job.attempts,
        "prompt_note": job.prompt_note,
    }


async def async_deliver(hass: HomeAssistant, entry_id: str, job: Job) -> None:
    """Fire the event; send the notification and the persistent notification if asked."""
    text = job.text or ""
    hass.bus.async_fire(EVENT_SUMMARY_READY, summary_ready_event_data(entry_id, job))
    if job.notify_target:
        try:
            await async_send_notification(hass, job.notify_target, job.title, text)
        except (HomeAssistantError, probatio.Invalid) as err:
            LOGGER.warning(
                "Job %s: could not notify %s: %s", job.id, job.notify_target, err
            )
    if job.persistent_notification:
        persistent_notification.async_create(
            hass, text, title=job.title, notification_id=f"{DOMAIN}_job_{job.id}"
        )


def _is_notify_entity(hass: HomeAssistant, target: str) -> bool:
    return target.startswith("notify.") and hass.states.get(target) is not None


def notify_target_exists(hass: HomeAssistant, target: str) -> bool:
    """Whether ``target`` is a notify entity or a (legacy) notify service."""
    return _is_notify_entity(hass, target) or hass.services.has_service(
        "notify", target.removeprefix("notify.")
    )


async def async_send_notification(
    hass: HomeAssistant, target: str, title: str, message: str
) -> None:
    """Send to a notify entity (``notify.send_message``) or a legacy notify service."""
    if _is_notify_entity(hass, target):
        await hass.services.async_call(
            "notify",
            "send_message",
            {"entity_id": target, "title": title, "message": message},
            blocking=True,
        )
        return
    service = target.removeprefix("notify.")
    if not hass.services.has_service("notify", service):
        raise validation_error("notify_target_not_found", target=target)
    await hass.services.async_call(
        "notify", service, {"title": title, "message": message}, blocking=True
    )
