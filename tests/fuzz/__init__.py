"""Property-based hardening: hostile inputs for every reader, shared by `tests/test_fuzz.py` (CI budget) and
`python -m tests.fuzz_all` (10,000 examples per reader, survival table)."""
