"""hydraplan cost models: produce the `CostProfile` the planner plans with.

Producers: `analytic.build_profile` (formulas over catalog specs) and `profile_io.load_profile`
(a user's or the profiler's file). Imports flow one way: this package imports `planner`, never the
reverse.
"""

from hydraplan.cost_models.analytic import AnalyticOptions, build_profile, training_flops_per_token
from hydraplan.cost_models.catalog import CatalogError, get_gpu, get_model, load_gpus, load_models
from hydraplan.cost_models.profile_io import ProfileError, load_profile, save_profile

__all__ = [
    "AnalyticOptions",
    "CatalogError",
    "ProfileError",
    "build_profile",
    "get_gpu",
    "get_model",
    "load_gpus",
    "load_models",
    "load_profile",
    "save_profile",
    "training_flops_per_token",
]
