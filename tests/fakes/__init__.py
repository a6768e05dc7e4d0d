"""Local stand-ins for model APIs, on 127.0.0.1, that enforce the real APIs' rules (tests only)."""
