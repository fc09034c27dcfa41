"""The test suite. :mod:`tests.support` holds what tests share (the gloo rank pool, the dense reference)."""
