"""Hostile and awkward inputs to the spec tools (issue 17): every one gives located diagnostics, fast."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlsched.spec.fmt import format_source
from tests.spec.conftest import ROOT, errors, load


@pytest.mark.parametrize("text", ['policy "default" { health {} }\n', 'pool "a" { lifecycle {} }\n',
                                  'pool "a" { lifecycle { prevent_destroy = true } }\n'])
def test_one_line_block_holding_a_block(tmp_path: Path, text: str) -> None:
    """A nested block on a one-line block is one located error (it raised IndexError before)."""
    diags = errors(tmp_path, text)
    match = [d for d in diags if d.summary == "Argument definition required"]
    assert len(match) == 1, diags
    assert match[0].range is not None and (match[0].range.line, match[0].range.column) == (1, text.index("{") + 3)
    out, fdiags = format_source(text, "x.hcl")
    assert out is None and [d.summary for d in fdiags] == ["Argument definition required"]


# --- evaluation bombs (issue 17 item 9) -------------------------------------------------

_A1K = 'join("", [for i in range(1024) : "a"])'
_DOUBLING_STRINGS = "locals {\n  s0 = \"aaaaaaaaaa\"\n" + "".join(
    f'  s{i + 1} = "${{local.s{i}}}${{local.s{i}}}"\n' for i in range(40)) + "}\n"
_DOUBLING_LISTS = "locals {\n  l0 = [1, 2]\n" + "".join(
    f"  l{i + 1} = concat(local.l{i}, local.l{i})\n" for i in range(40)) + "}\n"
_SHARED_DOUBLING = "locals {\n  l0 = [1, 2]\n" + "".join(
    f"  l{i + 1} = [local.l{i}, local.l{i}]\n" for i in range(60)) \
    + "}\noutput \"x\" {\n  value = jsonencode(local.l60)\n}\n"
_SQUARING = "locals {\n  n0 = 3\n" + "".join(f"  n{i + 1} = local.n{i} * local.n{i}\n" for i in range(40)) + "}\n"

# name -> (spec text, summaries any of which is the expected error)
BOMBS: dict[str, tuple[str, set[str]]] = {
    "redos-replace": (f'output "x" {{\n  value = replace("${{{_A1K}}}!", "/(a+)+$/", "x")\n}}\n', set()),
    "redos-regex": (f'locals {{\n  x = regex("(a|a)*b", {_A1K})\n}}\n', {"Invalid function argument"}),
    "string-doubling": (_DOUBLING_STRINGS, {"String too long"}),
    "list-doubling": (_DOUBLING_LISTS, {"Collection too large", "Value too large"}),
    "shared-doubling": (_SHARED_DOUBLING, {"Value too large"}),
    "for-product": ("locals {\n  x = length(flatten([for a in range(1024) : [for b in range(1024) : "
                    "[for c in range(1024) : 1]]]))\n}\n", {"Evaluation budget exceeded", "Value too large"}),
    "format-width": ('locals {\n  x = format("%2000000000s", "a")\n}\n', {"Invalid function argument"}),
    "formatlist-width": ('locals {\n  x = formatlist("%1000000s", [for i in range(1024) : "a"])\n}\n',
                         {"Evaluation budget exceeded", "String too long"}),
    "deep-braces": ("locals {\n  x = " + "{a = " * 20000 + "1" + "}" * 20000 + "\n}\n", {"Too deeply nested"}),
    "deep-brackets": ("locals {\n  x = " + "[" * 100000 + "]" * 100000 + "\n}\n", {"Too deeply nested"}),
    "deep-templates": ('locals {\n  x = ' + '"${' * 5000 + "1" + '}"' * 5000 + "\n}\n", {"Too deeply nested"}),
    "huge-file": ("locals {\n" + "  # padding\n" * 60000 + "}\n", {"File too large"}),
    "operator-chain": ("locals {\n  x = " + " + ".join(["1"] * 20000) + "\n}\n", {"Expression too deeply nested"}),
    "attribute-chain": ("locals {\n  x = local.y" + ".a" * 20000 + "\n  y = 1\n}\n",
                        {"Expression too deeply nested"}),
    "integer-squaring": (_SQUARING, {"Number out of range"}),
    "integer-literal": ("locals {\n  x = " + "9" * 5000 + "\n}\n", {"Number out of range"}),
    "join-separator": (f"locals {{\n  s = {_A1K}\n  x = join(local.s, [for i in range(1024) : local.s])\n}}\n",
                       {"Invalid function argument"}),
    "replace-growth": (f'locals {{\n  s = {_A1K}\n  x = replace(local.s, "a", "${{local.s}}${{local.s}}")\n}}\n',
                       {"Invalid function argument"}),
    "try-swallow": ("locals {\n" + "".join(
        f"  t{i} = try(length([for a in range(1024) : [for b in range(1024) : b]]), 0)\n" for i in range(3))
        + "}\n", {"Evaluation budget exceeded", "Value too large"}),
    "set-of-100k": ("locals {\n  l = flatten([for i in range(1000) : [for j in range(100) : [i, j]]])\n"
                    "  s = toset(local.l)\n}\n", {"Evaluation budget exceeded", "Collection too large",
                                                  "Value too large"}),
    "splat-loop": ("locals {\n  big = [for i in range(1000) : { a = i }]\n"
                   "  x = [for i in range(1000) : length(local.big[*].a)]\n}\n", {"Evaluation budget exceeded"}),
    "deep-value": ("locals {\n  v0 = 1\n" + "".join(f"  v{i + 1} = [local.v{i}]\n" for i in range(200)) + "}\n",
                   {"Value nested too deeply"}),
}


_CHILD = """
import json, resource, sys, time
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a runaway fails here instead of swapping
from rlsched.spec import SpecError, load_spec
out = {}
for path in sorted(Path(sys.argv[1]).glob("*.hcl")):
    t0 = time.process_time()
    try:
        load_spec(path, env={})
        diags = []
    except SpecError as exc:
        diags = [(d.summary, d.range is not None and d.range.line >= 1) for d in exc.diagnostics
                 if d.severity == "error"]
    out[path.stem] = {"cpu": time.process_time() - t0, "diags": diags}
# The peak of THIS process image: ru_maxrss would also count the parent's resident pages that the
# fork before exec shared (Linux carries that high-water mark across exec), so a big pytest worker
# would look like a runaway spec. VmHWM belongs to the exec'd image alone.
hwm = [line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:")]
out["__maxrss_kib"] = int(hwm[0].split()[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(out))
"""


def test_evaluation_bombs_are_located_errors_in_bounded_time_and_memory(tmp_path: Path) -> None:
    """Each bomb ends in seconds with one located diagnostic (or its value), and all of them together
    stay within a few hundred MiB: run in a child under a 2 GiB address-space limit."""
    for name, (text, _summaries) in BOMBS.items():
        (tmp_path / f"{name}.hcl").write_text(text)
    res = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    rss = report.pop("__maxrss_kib")
    assert rss < 600 * 1024, f"{rss / 1024:.0f} MiB: {sorted(report.items(), key=lambda kv: -kv[1]['cpu'])[:3]}"
    for name, (_text, summaries) in BOMBS.items():
        got = report[name]
        assert got["cpu"] < 15, f"{name} took {got['cpu']:.1f} s of CPU"
        if not summaries:
            assert got["diags"] == [], (name, got)
            continue
        assert got["diags"] and got["diags"][0][0] in summaries, (name, got)
        assert all(located for _s, located in got["diags"]), (name, got)
        assert sum(s == "Evaluation budget exceeded" for s, _ in got["diags"]) <= 1, (name, got)


def test_regex_functions_use_terraform_re2_syntax(tmp_path: Path) -> None:
    text = ('output "a" {\n  value = replace("gpu-h100-01", "/h(\\\\d+)-(\\\\d+)/", "H$1.$${2}$$")\n}\n'
            'output "b" {\n  value = regex("(?P<model>[a-z]\\\\d+)-(?P<n>\\\\d+)", "gpu-h100-01")\n}\n'
            'output "c" {\n  value = regexall("\\\\d+", "a1b22c333")\n}\n'
            'output "d" {\n  value = regex("[a-z]+", "123abc")\n}\n')
    spec = load(tmp_path, text)
    assert spec.outputs == {"a": "gpu-H100.01$", "b": {"model": "h100", "n": "01"}, "c": ["1", "22", "333"],
                            "d": "abc"}
    diags = errors(tmp_path, 'locals {\n  x = replace("abc", "/(a)\\\\1/", "x")\n}\n')
    assert diags[0].summary == "Invalid function argument" and "RE2" in diags[0].detail
    assert diags[0].range is not None and diags[0].range.line == 2


def test_long_source_line_is_cut_in_the_diagnostic(tmp_path: Path) -> None:
    from rlsched.spec.render import render_text

    diags = errors(tmp_path, "locals {\n  x = [" + "1, " * 5000 + "@]\n}\n")
    text = render_text(diags)
    assert max(len(line) for line in text.splitlines()) < 200
    assert "^" in text


# --- one error per source mistake (issue 17 item 12) ------------------------------------

FOR_EACH_POOL = '''pool "gpu" {
  for_each   = { small = 1, big = 4, mid = 2, x = 3 }
  gpu_model  = "H100"
  capacity   = "on_demand"
  node_count = %s
}
'''


@pytest.mark.parametrize(("expr", "extra", "summary"), [
    ("each.vlaue", "", "Invalid each attribute"),
    ("each.value", '  region = 7 + "a"\n', "Invalid operand"),
    ("each.value", '  gpu_modle = "x"\n', "Unsupported argument"),
    ("each.value", '  capacity_x = 1\n', "Unsupported argument"),
    ("each.value", "  lifecycle {\n    prevent_destroy = maybe\n  }\n", "Unknown variable"),
    ("local.nope", "", "Reference to undeclared local value"),
    ("each.value", '  mig_layout = mig_layout.missing\n', "Reference to undeclared mig_layout"),
])
def test_a_mistake_in_a_for_each_block_is_reported_once(tmp_path: Path, expr: str, extra: str,
                                                        summary: str) -> None:
    text = (FOR_EACH_POOL % expr)[:-2] + extra + "}\n"
    diags = errors(tmp_path, text)
    assert [d.summary for d in diags] == [summary], [(d.summary, d.detail) for d in diags]


def test_instances_that_fail_differently_are_each_reported(tmp_path: Path) -> None:
    text = FOR_EACH_POOL.replace("{ small = 1, big = 4, mid = 2, x = 3 }", '{ a = "x", b = -1, c = 2 }') \
        % "each.value"
    assert sorted(d.summary for d in errors(tmp_path, text)) == ["Incorrect attribute value type", "Invalid value"]


# --- validate without variable values (issue 17 item 13) --------------------------------

UNSET = '''variable "n" {
  type = number
  validation {
    condition     = var.n <= 4
    error_message = "At most four nodes."
  }
}
variable "model" {
  type = string
}
variable "pools" {
  type = map(number)
}
pool "a" {
  gpu_model  = "H100"
  capacity   = "spot"
  node_count = var.n
  region     = "r-${var.n}"
}
pool "b" {
  gpu_model  = var.model
  capacity   = "on_demand"
  node_count = var.n > 2 ? 1 : 2
}
pool "c" {
  for_each   = var.pools
  gpu_model  = "H100"
  capacity   = "on_demand"
  node_count = each.value
  display_name = "c-${each.key}"
}
quota "q" {
  pool      = pool.c["x"]
  principal = "u"
  max_gpus  = length([for p in var.pools : p])
}
'''


def test_validate_needs_no_variable_values(tmp_path: Path) -> None:
    spec = load(tmp_path, UNSET, unknown_variables=True)
    assert set(spec.pools) == {"a", "b", 'c["*"]'}
    assert {"var.n", "var.model", "var.pools", "pool.a.node_count", "pool.b.gpu_model"} <= set(spec.unknown)
    # plan and apply still need them, naming every way to set one
    summaries = [d.summary for d in errors(tmp_path, UNSET)]
    assert summaries == [f'No value for required variable "{v}"' for v in ("n", "model", "pools")]
    # what is known is still checked, and values given are still validated
    diags = errors(tmp_path, UNSET.replace('"H100"', '"H1000"', 1), unknown_variables=True)
    assert [d.summary for d in diags] == ["Unknown GPU model"]
    diags = errors(tmp_path, UNSET, unknown_variables=True, var_args=["n=9"])
    assert [d.summary for d in diags] == ["Invalid value for variable"]
    diags = errors(tmp_path, UNSET.replace("each.value", "each.vlaue"), unknown_variables=True)
    assert [d.summary for d in diags] == ["Invalid each attribute"]
    diags = errors(tmp_path, UNSET.replace("var.n > 2", "var.nn > 2"), unknown_variables=True)
    assert [d.summary for d in diags] == ["Reference to undeclared input variable"]


@pytest.mark.parametrize("expr", ['"x-${var.u}"', "var.u ? 1 : 2", "[for x in var.u : x]", "var.u[0]",
                                  "length(var.u)", "var.u + 1", "!var.u", "{ (var.u) = 1 }", "var.u[*].a",
                                  "try(var.u, 1)", "can(var.u)", "var.u == 1", "false && var.u",
                                  'format("%s", var.u)', "concat(var.u...)"])
def test_unknown_values_propagate_without_errors(tmp_path: Path, expr: str) -> None:
    text = f'variable "u" {{\n}}\noutput "o" {{\n  value = {expr}\n}}\n'
    spec = load(tmp_path, text, unknown_variables=True)
    assert spec.outputs["o"] in (None, False)


# --- all errors at once, MIG layouts included (issue 22 item 11) ------------------------

_MIG = '''mig_layout "balanced" {
  devices = { "1g.10gb" = 9 }%s
}
pool "infer" {
  gpu_model  = "H100-80GB"
  nodes      = ["gpu-h100-01"]
  mig_layout = mig_layout.balanced%s
}
pool "other" {
  gpu_model = "H100-80GB"
  nodes     = ["gpu-h100-01"]%s
}
'''


@pytest.mark.parametrize(("layout_extra", "pool_extra", "other_extra", "others"), [
    ("", "\n  gpu_modle  = 1", "", ["Unsupported argument"]),
    ("\n  foo = 1", "", "", ["Unsupported argument"]),
    ("\n  foo = 1", "\n  node_count = \"x\"", "\n  capacity = \"spott\"",
     ["Conflicting arguments", "Incorrect attribute value type", "Invalid value", "Unsupported argument"]),
])
def test_mig_layout_errors_come_with_every_other_error(tmp_path: Path, layout_extra: str, pool_extra: str,
                                                       other_extra: str, others: list[str]) -> None:
    diags = errors(tmp_path, _MIG % (layout_extra, pool_extra, other_extra))
    summaries = [d.summary for d in diags]
    assert summaries.count("Invalid MIG layout") == 1 and "Node in two pools" in summaries, summaries
    assert sorted(s for s in summaries if s not in ("Invalid MIG layout", "Node in two pools")) == others


# --- settings nothing implements are rejected, not silently accepted (issue 17 item 14) -----

_SPOT = '''pool "od" {
  gpu_model  = "H100"
  capacity   = "on_demand"
  node_count = 1
}
pool "spot" {
  gpu_model  = "H100"
  capacity   = "spot"
  node_count = 2
  spot_market {
    %s
  }
  lifecycle {
    %s
  }
}
policy "p" {
  scheduler = "fifo"
  health {
    %s
  }
}
'''


@pytest.mark.parametrize(("spot", "lifecycle", "health", "rejected"), [
    ("max_price_per_gpu_hour = 2.1", "", "", "max_price_per_gpu_hour"),
    ("fallback_pool = pool.od", "", "", "fallback_pool"),
    ('on_preemption = "requeue"', "", "", "on_preemption"),
    ('on_preemption = "fail"', "", "", "on_preemption"),
    ("min_on_demand = 1", "", "", "min_on_demand"),
    ("", "create_before_destroy = true", "", "create_before_destroy"),
    ("", "", "min_success_rate = 0.9", "min_success_rate"),
])
def test_unimplemented_settings_are_rejected_where_written(tmp_path: Path, spot: str, lifecycle: str, health: str,
                                                           rejected: str) -> None:
    diags = errors(tmp_path, _SPOT % (spot, lifecycle, health))
    assert [d.summary for d in diags] == ["Setting not supported yet"]
    assert rejected in diags[0].detail and "not supported yet" in diags[0].detail
    line = next(i for i, text in enumerate((_SPOT % (spot, lifecycle, health)).splitlines(), 1) if rejected in text)
    assert diags[0].range is not None and diags[0].range.line == line


def test_settings_matching_what_happens_are_accepted(tmp_path: Path) -> None:
    spec = load(tmp_path, _SPOT % ('on_preemption = "checkpoint_and_requeue"\n    min_on_demand = 0',
                                   "create_before_destroy = false\n    prevent_destroy = true",
                                   'max_decision_latency = "20ms"'))
    assert spec.pools["spot"].spot_market is not None
    assert spec.policies["p"].health.max_decision_latency_s == 0.02


def test_hcl_md_example_as_written_names_every_unsupported_setting(tmp_path: Path) -> None:
    from tests.spec.conftest import NOT_SUPPORTED_YET, hcl_md_example_as_written

    diags = errors(tmp_path, hcl_md_example_as_written())
    assert {d.summary for d in diags} == {"Setting not supported yet"}
    assert sorted(d.detail.split(" ")[0] for d in diags) == sorted(NOT_SUPPORTED_YET)


def test_spec_files_together_are_bounded(tmp_path: Path) -> None:
    from rlsched.spec import SpecError, load_spec
    from rlsched.spec.limits import MAX_SOURCE_BYTES

    comment = "# " + "x" * 998 + "\n"  # 1,000 bytes that cost the parser little
    for name in ("a", "b", "c"):
        body = comment * (MAX_SOURCE_BYTES * 8 // 10 // len(comment))
        (tmp_path / f"{name}.hcl").write_text(body + f"locals {{\n  {name} = 1\n}}\n")
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path, env={})
    diags = [d for d in info.value.diagnostics if d.severity == "error"]
    assert [d.summary for d in diags] == ["Configuration too large"]
    assert diags[0].range is not None and diags[0].range.filename.endswith("c.hcl")


def test_a_layout_that_does_not_fit_is_one_error_however_many_pools_use_it(tmp_path: Path) -> None:
    text = ('mig_layout "l" {\n  devices = { "1g.10gb" = 9 }\n}\n'
            'pool "many" {\n  for_each   = toset(["a", "b", "c", "d"])\n  gpu_model  = "H100"\n'
            '  nodes      = ["n-${each.key}"]\n  mig_layout = mig_layout.l\n}\n'
            'pool "one" {\n  gpu_model  = "H100"\n  nodes      = ["m"]\n  mig_layout = mig_layout.l\n}\n'
            'pool "v100" {\n  for_each   = toset(["a", "b"])\n  gpu_model  = "V100-16GB"\n'
            '  nodes      = ["v-${each.key}"]\n  mig_layout = mig_layout.l\n}\n')
    diags = errors(tmp_path, text)
    assert [d.summary for d in diags] == ["Invalid MIG layout", "GPU model does not support MIG"]
    assert re.search(r"used by pool\.many at \S*main\.hcl:8:16, pool\.one at \S*main\.hcl:13:16\)",
                     diags[0].detail), diags[0].detail
    assert "pool.v100 uses" in diags[1].detail


def test_a_quota_mistake_in_a_for_each_block_is_one_error(tmp_path: Path) -> None:
    text = ('pool "p" {\n  gpu_model = "H100"\n  nodes     = ["n"]\n}\n'
            'quota "q" {\n  for_each   = toset(["a", "b", "c"])\n  pool       = pool.p\n'
            '  principal  = "user:${each.key}"\n  max_slices = { "1g.10gb" = 1 }\n}\n')
    assert [d.summary for d in errors(tmp_path, text)] == ["Invalid quota"]
