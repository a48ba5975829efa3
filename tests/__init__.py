"""The tests, laid out as the source is; helpers are imported from the repo root (tests.<dir>.<kit>)."""
