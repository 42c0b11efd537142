"""Export the live fleet as rlsched HCL or as mig-parted YAML.

``rlsched export`` is mig-parted's ``export`` verb for a whole fleet: it reads a
backend's inventory and writes it in a format the user already has tooling for,
so adopting rlsched starts from what is running (``shared/docs/HCL.md`` s. 2, 5, 8).

* **HCL**: one ``mig_layout`` block per distinct MIG layout (counts only,
  mig-parted vocabulary ``{ "<profile>" = count }``) and one ``pool`` per
  (GPU model, MIG layout, capacity, GPUs) group listing its nodes, with ``mig =
  "disabled"`` or ``mig_layout = mig_layout.<name>``. Only declared attributes are
  exported (HCL.md s. 1.4): no processes, health or utilisation. A node whose GPUs
  are configured differently is exported as a partial-GPU pool (``gpus = [0, 1]``)
  holding its largest group of alike GPUs (ties: the group of the lowest index):
  a node belongs to one pool, and plan leaves the GPUs outside ``gpus`` alone, so
  the export still plans to no change. The GPUs left out are named in a comment
  and a warning.
* **mig-parted**: ``version: v1`` and ``mig-configs`` with one label per distinct
  node configuration; a label is shared by every node configured alike, like
  mig-parted's ``all-1g.10gb`` or ``all-balanced``. Where one label means
  different profiles on different models (``all-balanced``), each model gets an
  entry with a ``device-filter`` of its PCI ids, as mig-parted's
  ``config-default.yaml`` does. A header comment maps each node to its label (the
  value of k8s-mig-manager's ``nvidia.com/mig.config``).

Nodes that cannot be exported faithfully are left out with a comment and a
warning: unreachable nodes (their layout is unknown) and nodes without GPUs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from rlsched.cluster.catalog import resolve_model_name
from rlsched.cluster.feasibility import named_layouts
from rlsched.runtime.backend import GpuInfo, NodeInfo

#: PCI device ids (mig-parted ``device-filter`` spelling) of the MIG-capable models.
PCI_IDS: dict[str, tuple[str, ...]] = {
    "A100-40GB": ("0x20B010DE", "0x20F110DE"),
    "A100-80GB": ("0x20B210DE", "0x20B510DE"),
    "H100-80GB": ("0x233010DE",),
    "H200-141GB": ("0x233510DE",),
}

Counts = tuple[tuple[str, int], ...]


@dataclass
class ExportResult:
    """The exported text plus what the caller should tell the user.

    Attributes:
        text: the HCL or YAML document.
        warnings: nodes left out or approximated, one line each.
        assignments: hostname -> pool name (HCL) or mig-parted label.
    """

    text: str
    warnings: list[str] = field(default_factory=list)
    assignments: dict[str, str] = field(default_factory=dict)


def _counts(g: GpuInfo) -> Counts:
    return tuple(sorted(g.layout_counts().items()))


def _gpu_key(g: GpuInfo) -> tuple[str, str, bool, Counts]:
    """What a GPU declares: model, MIG on/off and layout (placement ignored)."""
    model = g.model or resolve_model_name(g.name) or ""
    return (g.name, model, g.mig_current, _counts(g) if g.mig_current else ())


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    return s if s and s[0].isalpha() else f"x_{s}"


def _counts_text(counts: Counts) -> str:
    return "+".join(f"{c}x{p}" for p, c in counts) or "none"


def _named_layout(model: str, counts: Counts) -> str | None:
    """The rlsched/mig-parted name of ``counts`` on ``model`` (``balanced``, ``all-1g``...)."""
    from rlsched.cluster.catalog import CATALOG

    if model not in CATALOG:
        return None
    for name, names in named_layouts(CATALOG[model]).items():
        want: dict[str, int] = {}
        for n in names:
            want[n] = want.get(n, 0) + 1
        if tuple(sorted(want.items())) == counts:
            return name
    return None


def _describe(g: GpuInfo) -> str:
    return f"{g.name} MIG {'/'.join(f'{c}x{p}' for p, c in _counts(g)) if g.mig_current else 'off'}"


def _partial(node: NodeInfo) -> tuple[tuple[int, ...] | None, list[GpuInfo], list[GpuInfo]]:
    """``(indices, kept, left_out)``: ``indices`` None when every GPU of the node is alike."""
    by_key: dict[tuple[str, str, bool, Counts], list[GpuInfo]] = {}
    for g in sorted(node.gpus, key=lambda g: g.index):
        by_key.setdefault(_gpu_key(g), []).append(g)
    if len(by_key) == 1:
        return None, list(node.gpus), []
    # the largest group; among equals, the one holding the lowest GPU index (dicts keep that order)
    kept = max(by_key.values(), key=len)
    left = sorted((g for g in node.gpus if g not in kept), key=lambda g: g.index)
    return tuple(g.index for g in kept), kept, left


def _skip_reason(node: NodeInfo) -> str | None:
    if not node.reachable:
        return "unreachable at export; its GPUs are unknown"
    if not node.gpus:
        return "reports no GPUs"
    return None


# --- HCL -------------------------------------------------------------------------------


def _hcl_str(s: str) -> str:
    """An HCL string literal (JSON escapes plus HCL's template escapes)."""
    return json.dumps(s).replace("${", "$${").replace("%{", "%%{")


def _hcl_map(counts: Counts) -> str:
    if not counts:
        return "{}"
    return "{ " + ", ".join(f"{_hcl_str(p)} = {c}" for p, c in counts) + " }"


def _hcl_list(items: Sequence[str], indent: str) -> str:
    one = "[" + ", ".join(_hcl_str(i) for i in items) + "]"
    if len(one) <= 80:
        return one
    inner = "".join(f"{indent}  {_hcl_str(i)},\n" for i in items)
    return "[\n" + inner + indent + "]"


def _hcl_block(header: str, attrs: Sequence[tuple[str, str]], comments: Sequence[str] = ()) -> str:
    width = max(len(k) for k, _ in attrs)
    lines = [f"{header} {{"]
    lines += [f"  # {c}" for c in comments]
    lines += [f"  {k.ljust(width)} = {v}" for k, v in attrs]
    lines.append("}")
    return "\n".join(lines)


def export_hcl(nodes: Sequence[NodeInfo], source: str = "") -> ExportResult:
    """The fleet as rlsched HCL: ``mig_layout`` blocks, then one ``pool`` per group.

    Args:
        nodes: the backend's inventory.
        source: the backend name, recorded in the header comment.
    """
    result = ExportResult(text="")
    skipped: list[str] = []
    # (name, model, mig_on, counts, capacity, GPU indices or None for all) -> hostnames
    groups: dict[tuple[str, str, bool, Counts, str, tuple[int, ...] | None], list[str]] = {}
    notes: dict[tuple[str, str, bool, Counts, str, tuple[int, ...] | None], list[str]] = {}
    for node in sorted(nodes, key=lambda n: n.hostname):
        reason = _skip_reason(node)
        if reason is not None:
            skipped.append(f"{node.hostname}: {reason}")
            result.warnings.append(f"{node.hostname} not exported: {reason}")
            continue
        indices, kept, left_out = _partial(node)
        name, model, mig_on, counts = _gpu_key(kept[0])
        capacity = node.labels.get("capacity", "on_demand")
        if capacity not in ("on_demand", "spot"):
            capacity = "on_demand"
        key = (name, model, mig_on, counts, capacity, indices)
        groups.setdefault(key, []).append(node.hostname)
        if left_out:
            what = "; ".join(f"GPU {g.index} ({_describe(g)})" for g in left_out)
            notes.setdefault(key, []).append(f"{node.hostname}: {what} in no pool (a node belongs to one pool)")
            result.warnings.append(f"{node.hostname}: GPUs {', '.join(map(str, indices or ()))} exported as a "
                                   f"partial-GPU pool; {what} left out: a node belongs to one pool")
        if any(g.mig_pending != g.mig_current for g in node.gpus):
            notes.setdefault(key, []).append(f"{node.hostname}: a MIG mode change is pending a GPU reset")
        if node.cordoned:
            notes.setdefault(key, []).append(f"{node.hostname}: cordoned at export")

    # One mig_layout per distinct counts; named after the standard layout it matches.
    layout_models: dict[Counts, list[str]] = {}
    for gkey in groups:
        if gkey[2]:
            layout_models.setdefault(gkey[3], []).append(gkey[1])
    bases: dict[Counts, str] = {}
    for counts, models in layout_models.items():
        named = next((n for m in models if (n := _named_layout(m, counts))), None)
        if not counts:
            bases[counts] = "empty"
        elif named:
            bases[counts] = _slug(named)
        else:
            bases[counts] = "mig_" + "_".join(f"{c}x_{_slug(p)}" for p, c in counts)
    labels: dict[Counts, str] = {}
    for counts, base in bases.items():
        clash = sum(1 for b in bases.values() if b == base) > 1
        labels[counts] = f"{base}_{_slug(layout_models[counts][0])}" if clash else base

    blocks: list[str] = []
    header = f"# Exported by rlsched{' from ' + source if source else ''}: {len(groups)} pool(s), " \
             f"{sum(len(v) for v in groups.values())} node(s).\n" \
             "# Declared attributes only (MIG mode and layout); capacity is on_demand unless a node says otherwise."
    for counts, label in sorted(labels.items(), key=lambda kv: kv[1]):
        blocks.append(_hcl_block(f"mig_layout {_hcl_str(label)}", [("devices", _hcl_map(counts))],
                                 [f"mig-parted counts: {_counts_text(counts)}"]))
    used: set[str] = set()
    for key in sorted(groups, key=lambda k: (k[1], k[0], not k[2], labels.get(k[3], ""), k[4], k[5] or ())):
        name, model, mig_on, counts, capacity, indices = key
        pool = _slug(model or name) + (f"_{bases[counts]}" if mig_on else "") + ("_spot" if capacity == "spot" else "")
        if indices is not None:
            pool += "_gpus_" + "_".join(map(str, indices))
        base, suffix = pool, 2
        while pool in used:
            pool, suffix = f"{base}_{suffix}", suffix + 1
        used.add(pool)
        attrs = [("gpu_model", _hcl_str(name)), ("capacity", _hcl_str(capacity)),
                 ("nodes", _hcl_list(groups[key], "  "))]
        if indices is not None:
            attrs.append(("gpus", "[" + ", ".join(map(str, indices)) + "]"))
        attrs.append(("mig_layout", f"mig_layout.{labels[counts]}") if mig_on else ("mig", _hcl_str("disabled")))
        blocks.append(_hcl_block(f"pool {_hcl_str(pool)}", attrs, notes.get(key, [])))
        for host in groups[key]:
            result.assignments[host] = pool
    tail = "".join(f"\n# not exported: {s}" for s in skipped)
    result.text = header + "\n\n" + "\n\n".join(blocks) + ("\n" if blocks else "") + tail + ("\n" if tail else "")
    return result


# --- mig-parted --------------------------------------------------------------------------


def _entries(node: NodeInfo) -> list[dict[str, Any]]:
    """The node's GPUs as mig-parted entries, grouping GPUs that are configured alike."""
    by_cfg: dict[tuple[bool, Counts], list[int]] = {}
    for g in sorted(node.gpus, key=lambda g: g.index):
        by_cfg.setdefault((g.mig_current, _counts(g) if g.mig_current else ()), []).append(g.index)
    out: list[dict[str, Any]] = []
    for (mig_on, counts), indices in by_cfg.items():
        entry: dict[str, Any] = {"devices": "all" if len(by_cfg) == 1 else indices, "mig-enabled": mig_on}
        if mig_on:
            entry["mig-devices"] = dict(counts)
        out.append(entry)
    return out


def _mig_parted_label(node: NodeInfo, model: str) -> str | None:
    """mig-parted's conventional label for a uniformly configured node, else None."""
    keys = {_gpu_key(g) for g in node.gpus}
    if len(keys) != 1:
        return None
    _name, _model, mig_on, counts = next(iter(keys))
    if not mig_on:
        return "all-disabled"
    if not counts:
        return "all-enabled"
    named = _named_layout(model, counts)
    if named == "balanced":
        return "all-balanced"
    if len(counts) == 1:
        from rlsched.cluster.catalog import CATALOG

        profile, count = counts[0]
        if model in CATALOG and any(p.name == profile and p.max_count == count for p in CATALOG[model].mig_profiles):
            return f"all-{profile}"
    return None


def export_mig_parted(nodes: Sequence[NodeInfo], source: str = "") -> ExportResult:
    """The fleet as a mig-parted ``version: v1`` config file.

    Args:
        nodes: the backend's inventory.
        source: the backend name, recorded in the header comment.
    """
    result = ExportResult(text="")
    # label -> model -> entries (node configs that share a label must agree per model)
    configs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    content_label: dict[str, str] = {}
    skipped: list[str] = []
    for node in sorted(nodes, key=lambda n: n.hostname):
        reason = _skip_reason(node)
        if reason is not None:
            skipped.append(f"{node.hostname}: {reason}")
            result.warnings.append(f"{node.hostname} not exported: {reason}")
            continue
        models = {_gpu_key(g)[1] for g in node.gpus}
        model = next(iter(models)) if len(models) == 1 else "+".join(sorted(models))
        entries = _entries(node)
        label = _mig_parted_label(node, model)
        if label is None:
            sig = json.dumps([model, entries], sort_keys=True)
            label = content_label.setdefault(sig, f"custom-{len(content_label) + 1}")
        per_model = configs.setdefault(label, {})
        if model in per_model and per_model[model] != entries:
            # Same conventional label, different GPU counts per node: keep them apart.
            sig = json.dumps([model, entries], sort_keys=True)
            label = content_label.setdefault(sig, f"custom-{len(content_label) + 1}")
            per_model = configs.setdefault(label, {})
        per_model[model] = entries
        result.assignments[node.hostname] = label

    doc: dict[str, Any] = {"version": "v1", "mig-configs": {}}
    renamed: dict[tuple[str, str], str] = {}
    for label in sorted(configs):
        per_model = configs[label]
        distinct = {json.dumps(e, sort_keys=True) for e in per_model.values()}
        if len(distinct) == 1:
            doc["mig-configs"][label] = next(iter(per_model.values()))
            continue
        merged: list[dict[str, Any]] = []
        for model, entries in sorted(per_model.items()):
            if model not in PCI_IDS:
                # No PCI ids to filter on: give this model a label of its own.
                own = f"{label}-{_slug(model).replace('_', '-')}"
                doc["mig-configs"][own] = entries
                renamed[(label, model)] = own
                continue
            merged += [{"device-filter": list(PCI_IDS[model]), **e} for e in entries]
        if merged:
            doc["mig-configs"][label] = merged
    if renamed:
        for node in nodes:
            label = result.assignments.get(node.hostname)
            if label is None:
                continue
            models = {_gpu_key(g)[1] for g in node.gpus}
            model = next(iter(models)) if len(models) == 1 else "+".join(sorted(models))
            result.assignments[node.hostname] = renamed.get((label, model), label)

    lines = [f"# Exported by rlsched{' from ' + source if source else ''} (mig-parted v1 format).",
             "# Node -> label (k8s-mig-manager: nvidia.com/mig.config=<label>):"]
    lines += [f"#   {host}: {label}" for host, label in sorted(result.assignments.items())]
    lines += [f"# not exported: {s}" for s in skipped]
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)
    result.text = "\n".join(lines) + "\n" + body
    return result


def export_fleet(nodes: Sequence[NodeInfo], fmt: str, source: str = "") -> ExportResult:
    """Dispatch on ``fmt`` (``hcl`` or ``mig-parted``)."""
    if fmt == "hcl":
        return export_hcl(nodes, source)
    if fmt == "mig-parted":
        return export_mig_parted(nodes, source)
    from rlsched.runtime.backend import BackendError

    raise BackendError(f"unknown export format {fmt!r}; expected 'hcl' or 'mig-parted'")
