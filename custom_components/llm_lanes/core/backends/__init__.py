"""Clients for LLM servers: the only code that speaks HTTP to them."""
