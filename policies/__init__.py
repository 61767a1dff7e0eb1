"""Scheduling policies, one module each; `registry` maps config names to classes."""
