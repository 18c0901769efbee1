# A package, so that its conftest is imported as conformance.conftest and does
# not shadow tests/integration/conftest.py (imported as plain "conftest") when
# both suites run in one pytest invocation.
