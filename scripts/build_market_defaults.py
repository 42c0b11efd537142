"""Build rlsched's bundled default market from the public data in ``shared/data``.

Usage (from the repository root)::

    python scripts/build_market_defaults.py --data ../shared/data --out rlsched/data

Writes ``default_prices.csv`` (canonical prices) and ``default_preemption.csv``
(Spot Advisor hazards and Kaplan-Meier lifetime curves). See ``rlsched/data/README.md``
for provenance, licences and which series are real.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from rlsched.market.canonical import PriceRow, write_prices
from rlsched.market.preemption import (
    KaplanMeierPreemption,
    advisor_estimates,
    lifetime_models,
    write_preemption_table,
)
from rlsched.market.sources import convert_aws, convert_gcp

#: GCP window (one year; H100 spot prices start 2024-05-17) and region.
GCP_START, GCP_END, GCP_REGION = "2024-06-01", "2025-06-01", "us-central1"
#: AWS region: the one the documented on-demand list prices are for.
AWS_REGION = "us-east-1"

#: Documented public on-demand list prices (USD per GPU-hour) for models without a
#: price series in shared/data: (price, source). Spot = price x (1 - Spot Advisor
#: median savings) where the advisor covers the model, else the listed spot price.
LIST_PRICES: dict[str, tuple[float, str]] = {
    "T4": (0.526, "AWS g4dn.xlarge (1x T4) us-east-1 on-demand $0.526/h"),
    "A10": (1.006, "AWS g5.xlarge (1x A10G) us-east-1 on-demand $1.006/h"),
    "V100-32GB": (31.212 / 8, "AWS p3dn.24xlarge (8x V100-32GB) us-east-1 on-demand $31.212/h / 8"),
    "H200-141GB": (84.80 / 8, "Azure ND96isr H200 v5 (8x H200) East US pay-as-you-go ~$84.80/h / 8"),
    "P100-16GB": (1.46, "GCP NVIDIA P100 GPU list price $1.46/GPU-h (GPU only, us-central1)"),
}
#: Listed spot prices where no advisor savings exist.
LIST_SPOT: dict[str, tuple[float, str]] = {
    "P100-16GB": (0.43, "GCP preemptible P100 list price $0.43/GPU-h"),
}
#: Proxies: same silicon, export variants without a public western list price.
PROXIES: dict[str, str] = {"A800-80GB": "A100-80GB", "H800-80GB": "H100-80GB"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", default="rlsched/data")
    args = ap.parse_args()
    data, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    gcp_rows, gcp_meta = convert_gcp(
        [data / "gcp-gpu-spot-prices/gcp_gpu_vm_price_changepoints_2022-02_to_2025-06.csv"],
        region=GCP_REGION, start=GCP_START, end=GCP_END)
    aws_rows, aws_meta = convert_aws([data / "aws-azure-spot-2020/aws_spot_price_history_p2_p3.csv"],
                                     region=AWS_REGION)
    rows: list[PriceRow] = [*gcp_rows, *aws_rows]
    advisor = advisor_estimates(data / "aws-spot-advisor/aws_spot_advisor_gpu_interruption.csv")

    notes: list[str] = []
    for model, (od, src) in LIST_PRICES.items():
        rows.append(PriceRow(0.0, model, "on_demand", round(od, 6), "list"))
        if model in advisor:
            sv = advisor[model].savings_pct
            rows.append(PriceRow(0.0, model, "spot", round(od * (1 - sv / 100.0), 6), "list"))
            notes.append(f"{model}: on_demand {od:.4f} ({src}); spot = x (1 - {sv:g}% advisor median savings, "
                         f"{'/'.join(advisor[model].families)})")
        else:
            sp, ssrc = LIST_SPOT[model]
            rows.append(PriceRow(0.0, model, "spot", sp, "list"))
            notes.append(f"{model}: on_demand {od:.4f} ({src}); spot {sp} ({ssrc})")
    for model, ref in PROXIES.items():
        for cap in ("on_demand", "spot"):
            vals = [r.usd_per_gpu_hour for r in gcp_rows if r.gpu_model == ref and r.capacity == cap]
            med = round(float(statistics.median(vals)), 6)
            rows.append(PriceRow(0.0, model, cap, med, "proxy"))
        notes.append(f"{model}: constant = median of the {ref} GCP series (proxy)")
    n = write_prices(out / "default_prices.csv", rows)

    hazards = {m: (e.hazard_per_hour, f"aws-spot-advisor {e.snapshot} {'/'.join(e.families)} median of {e.rows}")
               for m, e in advisor.items()}
    per_model, pooled = lifetime_models(data / "aws-azure-spot-2020/spot_instance_lifetimes_2020.csv")
    kms: dict[str, KaplanMeierPreemption] = {**per_model, "*": pooled}
    write_preemption_table(out / "default_preemption.csv", hazards, kms)

    print(f"wrote {n} price rows; GCP {gcp_meta.start:%Y-%m-%d}..{gcp_meta.end:%Y-%m-%d} {gcp_meta.regions}; "
          f"AWS {aws_meta.start:%Y-%m-%d}..{aws_meta.end:%Y-%m-%d} {aws_meta.regions}")
    for line in notes:
        print("  " + line)
    for m, (h, src) in sorted(hazards.items()):
        print(f"  hazard {m}: {h:.6f}/h ({src})")
    for m, km in sorted(kms.items()):
        print(f"  KM {m}: n={km.km.n} mean={km.mean_lifetime_s / 3600:.2f} h S(end)={km.km.end_survival:.3f}")


if __name__ == "__main__":
    main()
