"""The spark tier uses the session-wide `spark` fixture of tests/conftest.py."""
