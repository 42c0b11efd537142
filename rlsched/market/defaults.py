"""The market rlsched uses when none is given (and, re-exported, the default provisioning delays).

:func:`default_market` reads two small files bundled in ``rlsched/data/`` (built from
``shared/data`` by ``scripts/build_market_defaults.py``; provenance, licences and which
series are real versus documented list-price constants are in ``rlsched/data/README.md``):

* ``default_prices.csv``: canonical prices, one region per model, spot and on-demand
  for every MIG model and the common non-MIG ones;
* ``default_preemption.csv``: per-model Spot Advisor hazards and Kaplan-Meier curves
  of the 2020 lifetimes (per model where there were >= 20 observations, and pooled).

Spot models with an advisor hazard use it (exponential lifetimes); the others use their
own KM curve, else the pooled one.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from rlsched.cluster.provisioning import PROVISION_DELAY_S, provision_delay_s
from rlsched.errors import ScenarioError
from rlsched.market.canonical import PriceTable, read_prices
from rlsched.market.market import TableMarket
from rlsched.market.preemption import PreemptionModel, read_preemption_table

__all__ = [
    "DEFAULT_PREEMPTION_FILE",
    "DEFAULT_PRICES_FILE",
    "PROVISION_DELAY_S",
    "default_market",
    "default_preemption",
    "default_prices",
    "provision_delay_s",
]

DEFAULT_PRICES_FILE = "default_prices.csv"
DEFAULT_PREEMPTION_FILE = "default_preemption.csv"

def _data_path(name: str) -> str:
    return str(resources.files("rlsched").joinpath("data", name))


@lru_cache(maxsize=1)
def default_prices() -> PriceTable:
    """The bundled canonical price table."""
    return read_prices(_data_path(DEFAULT_PRICES_FILE))


@lru_cache(maxsize=1)
def _preemption_table() -> tuple[dict[str, PreemptionModel], dict[str, PreemptionModel]]:
    """The bundled table, read once: (advisor hazards, Kaplan-Meier curves incl. the pooled ``*``)."""
    hazards, kms = read_preemption_table(_data_path(DEFAULT_PREEMPTION_FILE))
    return dict(hazards), dict(kms)


@lru_cache(maxsize=1)
def default_preemption() -> tuple[dict[str, PreemptionModel], PreemptionModel | None]:
    """Per-model lifetime models and the pooled fallback, from the bundled table."""
    hazards, kms = _preemption_table()
    models: dict[str, PreemptionModel] = {m: km for m, km in kms.items() if m != "*"}
    models.update(hazards)  # the advisor hazard wins where both exist
    return models, kms.get("*")


#: ``preemption:`` choices of a scenario's market (see :func:`preemption_models`)
PREEMPTION_SOURCES = ("advisor", "observed")


def preemption_models(source: str = "advisor") -> tuple[dict[str, PreemptionModel], PreemptionModel | None]:
    """Lifetime models of spot nodes by evidence source.

    ``advisor`` (the default market's): the AWS Spot Advisor hazard where a model has
    one, else its 2020 Kaplan-Meier curve, else the pooled curve. ``observed``: only the
    observed 2020 lifetimes (per-model Kaplan-Meier curve, else the pooled one) - the
    harsh market of the 2020 price histories (mean life ~2.5 h, mostly 24 h-capped GCP
    preemptible VMs), where reclaims actually happen in a days-long simulation.

    Raises:
        ScenarioError: an unknown source.
    """
    if source == "advisor":
        return default_preemption()
    if source == "observed":
        _, kms = _preemption_table()
        return {m: km for m, km in kms.items() if m != "*"}, kms.get("*")
    raise ScenarioError(f"market.preemption must be one of {', '.join(PREEMPTION_SOURCES)}, got {source!r}")


def default_market(offset_s: float = 0.0) -> TableMarket:
    """The bundled market (see module doc); ``offset_s`` shifts market time."""
    models, fallback = default_preemption()
    return TableMarket(default_prices(), None, models, fallback, offset_s=offset_s)
