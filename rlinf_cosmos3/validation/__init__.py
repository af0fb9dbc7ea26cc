"""Checks of a run config against what is on disk, with the library's own readers (above ``config/``)."""
