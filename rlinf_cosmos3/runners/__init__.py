"""Drivers: they own the run directory, the cluster and the worker groups, and loop the steps."""
