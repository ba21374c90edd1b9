"""Errors of the planning library: both name the input at fault."""

from __future__ import annotations


class PlanError(ValueError):
    """The inputs admit no plan (e.g. the weights do not fit); the message says which input."""


class InputError(PlanError):
    """Bad user input (a file, a field, an argument): the message names it and what was expected."""
