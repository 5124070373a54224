"""The core, pure numpy: sampling, the acceptance rule, the loop, drafters, K policies, cost
formulas, the clock discipline, run stats and prompts. It imports no ML framework; a model is
reached only through the backend contract (specmac.backends.BaseBackend)."""

from specmac.core import hybrid, lookup  # noqa: F401,E402  (they register their drafters in drafters.FACTORIES)
