"""What the tests share: each backend's fixture module (`backend_<name>.py`), the stand-ins for services
this machine cannot reach (the LLM, E2B, the internet), and helpers for security and wire tests."""
