"""The scheduler: the only path from Home Assistant to one LLM server.

Contract (implemented by the scheduler-core issue):

    scheduler = Scheduler(backend, settings, clock=time.monotonic)
    async for chunk in scheduler.stream(chat_request, lane=Lane.VOICE, requester="user:abc"):
        ...                                  # StreamChunk; the last one has done=True and usage
    result = await scheduler.generate(chat_request, lane=Lane.AUTOMATION, requester="automation.x")
    scheduler.snapshot() -> SchedulerSnapshot
    scheduler.update_settings(settings)
    remove = scheduler.add_listener(callback)   # callback(FinishedRequest), called once per request
    await scheduler.close()                      # every waiting/running caller gets SchedulerClosedError
"""
