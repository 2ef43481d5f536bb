"""Declarative configuration (after dmlc-core's Parameter) and job files."""

from .errors import Error, Location, ParamError, Problem
from .parameter import Field, Parameter, field
from .registry import Registry, normalise

__all__ = ["Error", "Field", "Location", "ParamError", "Parameter", "Problem", "Registry", "field",
           "normalise"]
