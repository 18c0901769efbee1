# A package, so that its conftest is imported as security.conftest and does
# not shadow tests/integration/conftest.py (imported as plain "conftest") when
# the suites run in one pytest invocation.
