"""Pool specs in HCL: parse (python-hcl2), evaluate, check the schema, report diagnostics.

Public API::

    spec = load_spec(Path("pool.hcl"), var_args=["region=eu"])   # Spec, or SpecError with all diagnostics
    pools = to_pool_specs(spec)                                  # for the simulator

Importing this package is cheap: no torch, mlflow or NVML, so ``rlsched validate``
stays fast and runs anywhere.
"""

from rlsched.spec.loader import load_spec
from rlsched.spec.model import Diagnostic, SourceRange, Spec, SpecError
from rlsched.spec.pools import to_pool_specs

__all__ = ["Diagnostic", "SourceRange", "Spec", "SpecError", "load_spec", "to_pool_specs"]
