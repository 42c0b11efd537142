"""Spot and on-demand markets: canonical price/availability tables, converters of the
public GCP/AWS/Azure data, preemption models, and the :class:`Market` the simulator uses.
"""

from rlsched.market.base import Market
from rlsched.market.canonical import (
    AvailabilityRow,
    AvailabilityTable,
    PriceRow,
    PriceTable,
    read_availability,
    read_prices,
    write_availability,
    write_prices,
)
from rlsched.market.defaults import default_market, provision_delay_s
from rlsched.market.market import TableMarket
from rlsched.market.preemption import (
    AdvisorEstimate,
    ExponentialPreemption,
    KaplanMeier,
    KaplanMeierPreemption,
    PreemptionModel,
    advisor_estimates,
    hazard_from_monthly_pct,
    kaplan_meier,
    lifetime_models,
    read_lifetimes,
)
from rlsched.market.series import StepSeries
from rlsched.market.sources import ConversionMeta, convert_aws, convert_azure, convert_gcp

__all__ = [
    "AdvisorEstimate",
    "AvailabilityRow",
    "AvailabilityTable",
    "ConversionMeta",
    "ExponentialPreemption",
    "KaplanMeier",
    "KaplanMeierPreemption",
    "Market",
    "PreemptionModel",
    "PriceRow",
    "PriceTable",
    "StepSeries",
    "TableMarket",
    "advisor_estimates",
    "convert_aws",
    "convert_azure",
    "convert_gcp",
    "default_market",
    "hazard_from_monthly_pct",
    "kaplan_meier",
    "lifetime_models",
    "provision_delay_s",
    "read_availability",
    "read_lifetimes",
    "read_prices",
    "write_availability",
    "write_prices",
]
