"""The goodput benchmark: a simulated server, scenarios, a runner, reports and calibration."""
