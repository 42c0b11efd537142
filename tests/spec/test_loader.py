"""Loading specs: the HCL.md example, the shipped configs, and every class of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsched.cluster.model import GangMode, PoolKind, Sharing
from rlsched.spec import SpecError, load_spec, to_pool_specs
from rlsched.spec.gpu_names import resolve_gpu_name
from tests.spec.conftest import ROOT, errors, hcl_md_example, load

POOL = '''pool "p" {
  gpu_model = "H100"
  nodes     = ["n1"]
}
'''


def test_hcl_md_example_loads(tmp_path: Path) -> None:
    spec = load(tmp_path, hcl_md_example(), "pool.hcl")
    assert set(spec.pools) == {"train", "rollout"}
    train, rollout = spec.pools["train"], spec.pools["rollout"]
    assert train.gpu_model == "H100-80GB" and train.capacity == "on_demand"
    assert train.nodes == ("gpu-h100-01", "gpu-h100-02", "gpu-h100-03")
    assert train.display_name == "rl-us-east-train"
    assert train.lifecycle.prevent_destroy and train.disruption.drain_timeout_s == 900
    assert rollout.mig_layout == "balanced" and rollout.spot_market is not None
    assert rollout.spot_market.on_preemption == "checkpoint_and_requeue"
    assert spec.layouts["balanced"].devices == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert spec.quotas["team_rl"].pool == "rollout" and spec.quotas["team_rl"].max_slices["3g.40gb"] == 2
    policy = spec.policies["default"]
    assert policy.scheduler == "rl" and policy.fallback == "weighted-priority"
    assert policy.model == "models/ppo-mask-h100/model.zip" and policy.health.max_decision_latency_s == 0.05
    pools = {p.name: p for p in to_pool_specs(spec)}
    assert pools["rollout"].sharing is Sharing.MIG
    assert pools["rollout"].mig_layout == ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")


@pytest.mark.parametrize("name", ["local.hcl", "onprem-mig.hcl", "hybrid-spot.hcl"])
def test_configs_validate_and_simulate(name: str) -> None:
    spec = load_spec(ROOT / "configs" / name, env={})
    pools = to_pool_specs(spec)
    assert pools
    for p in pools:
        assert p.max_nodes >= 1 and p.gpus_per_node >= 1
        if p.kind is PoolKind.ONPREM:
            assert p.min_nodes == p.max_nodes
    if name == "hybrid-spot.hcl":
        spot = next(p for p in pools if p.kind is PoolKind.SPOT)
        assert (spot.min_nodes, spot.max_nodes) == (0, 8)


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200", "h100"])
def test_nvml_names_resolve(name: str) -> None:
    assert resolve_gpu_name(name) is not None


# (text, summary fragment, detail fragment, line, column)
BAD = [
    ("syntax-missing-brace", 'pool "a" {\n  gpu_model = "H100"\n', "Unclosed bracket", "never closed", 1, 10),
    ("syntax-list", 'locals {\n  nodes = [ "a" "b" ]\n}\n', "Invalid syntax", 'Expected "," or "]"', 2, 17),
    ("syntax-eqeq", 'locals {\n  gpus = = 8\n}\n', "Invalid syntax", "where a value was expected", 2, 10),
    ("syntax-char", 'locals {\n  x = 1 @\n}\n', "Invalid character", '"@"', 2, 9),
    ("type", 'pool "p" {\n  gpu_model = "H100"\n  nodes = ["n"]\n  node_count = "x"\n}\n',
     "Conflicting arguments", "", 4, 3),
    ("type-number", 'pool "p" {\n  gpu_model = "H100"\n  node_count = [1]\n}\n',
     "Incorrect attribute value type", "whole number", 3, 16),
    ("unknown-local", 'locals {\n  rollout_nodes = ["a"]\n}\npool "p" {\n  gpu_model = "H100"\n'
     "  nodes     = local.rollout_nodez\n}\n", "Reference to undeclared local value",
     'Did you mean "rollout_nodes"?', 6, 15),
    ("unknown-attr", 'pool "p" {\n  gpu_modle = "H100"\n  nodes = ["a"]\n}\n', "Unsupported argument",
     'Did you mean "gpu_model"?', 2, 3),
    ("unknown-block", 'pol "p" {\n}\n', "Unsupported block type", 'Did you mean "pool"?', 1, 1),
    ("cycle", 'locals {\n  a = local.b\n  b = local.a\n}\n', "Cycle in local values", "local.a -> local.b", 3, 7),
    ("layout", 'mig_layout "l" {\n  devices = { "1g.10gb" = 8 }\n}\npool "p" {\n  gpu_model = "NVIDIA H100 80GB HBM3"\n'
     '  nodes = ["a"]\n  mig_layout = mig_layout.l\n}\n', "Invalid MIG layout",
     '8 × "1g.10gb" does not fit an H100-80GB (max 7)', 2, 13),  # noqa: RUF001
    ("layout-compute", 'mig_layout "l" {\n  devices = { "3g.40gb" = 2, "2g.20gb" = 1 }\n}\npool "p" {\n'
     '  gpu_model = "H100"\n  nodes = ["a"]\n  mig_layout = mig_layout.l\n}\n', "Invalid MIG layout",
     "compute slices", 2, 13),
    ("node-two-pools", 'pool "a" {\n  gpu_model = "H100"\n  nodes = ["n1"]\n}\npool "b" {\n  gpu_model = "H100"\n'
     '  nodes = ["n1"]\n}\n', "Node in two pools", "n1 is in pool.a (", 7, 11),
    ("fallback", 'policy "d" {\n  scheduler = "fifo"\n  fallback = "rl"\n}\n', "Invalid fallback",
     "the fallback must be a heuristic", 3, 14),
    ("missing-var", 'variable "nodes" {\n  type = list(string)\n}\n', 'No value for required variable "nodes"',
     "RLSCHED_VAR_nodes", 1, 10),
    ("duplicate-attr", 'pool "p" {\n  capacity = "spot"\n  capacity = "spot"\n}\n', "Attribute redefined",
     "main.hcl:2:3", 3, 3),
    ("interp-label", 'pool "${var.x}" {\n}\n', "Invalid block label", "Template sequences", 1, 6),
    ("two-on-a-line", 'pool "p" {\n  gpu_model = "H100"  nodes = ["a"]\n}\n', "Missing newline", "", 2, 23),
    ("attr-and-block", 'pool "p" {\n  lifecycle = 1\n  lifecycle {\n  }\n}\n', "Argument and block with one name",
     "main.hcl:2:3", 3, 3),
    ("count", 'pool "p" {\n  count = 2\n  gpu_model = "H100"\n  nodes = ["a"]\n}\n', "count is not supported",
     "for_each", 2, 3),
    ("scheduler", 'policy "d" {\n  scheduler = "fifoo"\n}\n', "Invalid scheduler", 'Did you mean "fifo"?', 2, 15),
    ("gpu-model", 'pool "p" {\n  gpu_model = "H1000"\n  nodes = ["a"]\n}\n', "Unknown GPU model", "", 2, 15),
    ("unknown-ref", POOL + 'quota "q" {\n  pool = pool.pp\n  principal = "x"\n  max_gpus = 1\n}\n',
     "Reference to undeclared pool", 'Did you mean "p"?', 6, 10),
    ("multiline-string", 'locals {\n  x = "a\nb"\n}\n', "Invalid multi-line string", "heredoc", 2, 8),
    ("duration", POOL.replace("}\n", '  disruption {\n    drain_timeout = "15 minutes"\n  }\n}\n'),
     "Invalid duration", '"15m"', 5, 21),
    ("function", 'locals {\n  x = lenght([1])\n}\n', "Call to unknown function", 'Did you mean "length"?', 2, 7),
    ("operator", 'locals {\n  x = 1 + "a"\n}\n', "Invalid operand", '"+"', 2, 11),
    ("gang", POOL.replace("}\n", '  gang = "whole_nodes"\n}\n'), "Invalid value",
     '"whole_nodes" is not one of "whole-nodes", "packed". Did you mean "whole-nodes"?', 4, 10),
    ("gang-type", POOL.replace("}\n", "  gang = true\n}\n"), "Incorrect attribute value type",
     "gang: a string is required", 4, 10),
]


@pytest.mark.parametrize(("case", "text", "summary", "detail", "line", "column"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_diagnostics(tmp_path: Path, case: str, text: str, summary: str, detail: str, line: int,
                               column: int) -> None:
    diags = errors(tmp_path, text)
    match = [d for d in diags if summary in d.summary]
    assert match, [(d.summary, d.detail) for d in diags]
    d = match[0]
    assert detail in d.detail
    assert d.range is not None
    assert (d.range.filename.endswith("main.hcl"), d.range.line, d.range.column) == (True, line, column), d


def test_all_errors_collected(tmp_path: Path) -> None:
    text = 'pool "a" {\n  gpu_modle = "H100"\n  nodes = ["n"]\n}\npolicy "d" {\n  scheduler = "nope"\n}\n'
    diags = errors(tmp_path, text)
    assert {d.summary for d in diags} >= {"Unsupported argument", "Invalid scheduler"}


VARS = '''variable "region" {
  type    = string
  default = "default"
}
variable "n" {
  type    = number
  default = 1
  validation {
    condition     = var.n <= 4
    error_message = "At most four nodes."
  }
}
pool "p" {
  gpu_model  = "H100"
  capacity   = "spot"
  node_count = var.n
  region     = var.region
}
'''


def test_variable_precedence(tmp_path: Path) -> None:
    assert load(tmp_path, VARS).pools["p"].region == "default"
    env = {"RLSCHED_VAR_region": "env", "RLSCHED_VAR_n": "2"}
    spec = load(tmp_path, VARS, env=env)
    assert spec.pools["p"].region == "env" and spec.pools["p"].node_count == 2
    (tmp_path / "b.auto.rlvars").write_text('region = "auto-b"\n')
    (tmp_path / "a.auto.rlvars").write_text('region = "auto-a"\nn = 3\n')
    assert load(tmp_path, VARS, env=env).pools["p"].region == "auto-b"  # lexical order: b after a
    f1 = tmp_path / "one.rlvars"
    f1.write_text('region = "file"\n')
    spec = load(tmp_path, VARS, env=env, var_sources=[("var", "region=cli"), ("file", str(f1))])
    assert spec.pools["p"].region == "file"
    spec = load(tmp_path, VARS, env=env, var_sources=[("file", str(f1)), ("var", "region=cli")])
    assert spec.pools["p"].region == "cli" and spec.pools["p"].node_count == 3


def test_variable_validation_and_types(tmp_path: Path) -> None:
    diags = errors(tmp_path, VARS, var_args=["n=9"])
    assert diags[0].summary == "Invalid value for variable" and "At most four nodes." in diags[0].detail
    diags = errors(tmp_path, VARS, var_args=["n=many"])
    assert "number" in diags[0].detail
    diags = errors(tmp_path, VARS, var_args=["nn=1"])
    assert 'Did you mean "n"?' in diags[0].detail


def test_complex_variable_from_env(tmp_path: Path) -> None:
    text = 'variable "nodes" {\n  type = list(string)\n}\npool "p" {\n  gpu_model = "H100"\n  nodes = var.nodes\n}\n'
    spec = load(tmp_path, text, env={"RLSCHED_VAR_nodes": '["a", "b"]'})
    assert spec.pools["p"].nodes == ("a", "b")


def test_for_each(tmp_path: Path) -> None:
    text = '''pool "gpu" {
  for_each   = { small = 1, big = 4 }
  gpu_model  = "H100"
  capacity   = "on_demand"
  node_count = each.value
  display_name = "pool ${each.key}"
}
quota "q" {
  for_each  = toset(["a", "b"])
  pool      = pool.gpu["big"]
  principal = "user:${each.key}"
  max_gpus  = 2
}
'''
    spec = load(tmp_path, text)
    assert spec.pools['gpu["big"]'].node_count == 4
    assert spec.pools['gpu["small"]'].display_name == "pool small"
    assert {q.principal for q in spec.quotas.values()} == {"user:a", "user:b"}
    assert all(q.pool == 'gpu["big"]' for q in spec.quotas.values())
    bad = text.replace("toset([\"a\", \"b\"])", '["a", "b"]')
    assert "toset" in errors(tmp_path, bad)[0].detail


FUNCS = {
    'length([1, 2, 3])': 3,
    'slice([1, 2, 3], 1, 3)': [2, 3],
    'concat([1], [2, 3])': [1, 2, 3],
    'merge({ a = 1 }, { b = 2 })': {"a": 1, "b": 2},
    'toset(["b", "a", "b"])': ["a", "b"],
    'keys({ b = 1, a = 2 })': ["a", "b"],
    'values({ b = 1, a = 2 })': [2, 1],
    'lookup({ a = 1 }, "b", 7)': 7,
    'range(3)': [0, 1, 2],
    'format("%s-%02d", "n", 3)': "n-03",
    'min(3, 1, 2)': 1,
    'max(3, 1, 2)': 3,
    'upper("a")': "A",
    'lower("A")': "a",
    'join(",", ["a", "b"])': "a,b",
    'split(",", "a,b")': ["a", "b"],
    'contains(["a"], "a")': True,
    'coalesce("", "x")': "x",
    'abs(-2)': 2,
    'ceil(1.2)': 2,
    'floor(1.8)': 1,
    '[for i in range(3) : i * 2 if i > 0]': [2, 4],
    '{ for s in ["a", "bb"] : s => length(s) }': {"a": 1, "bb": 2},
    '1 + 2 * 3 > 6 ? "y" : "n"': "y",
    '"%{if true}yes%{else}no%{endif}"': "yes",
    '"%{for x in ["a", "b"]}${x};%{endfor}"': "a;b;",
    '7 / 2': 3.5,
    'try(local.nope, "fallback")': "fallback",
    '[{ a = 1 }, { a = 2 }][*].a': [1, 2],
}


@pytest.mark.parametrize(("expr", "want"), list(FUNCS.items()))
def test_functions_and_expressions(tmp_path: Path, expr: str, want: object) -> None:
    spec = load(tmp_path, f'output "x" {{\n  value = {expr}\n}}\n')
    assert spec.outputs["x"] == want


def test_heredoc_interpolation(tmp_path: Path) -> None:
    text = 'locals {\n  n = "x"\n}\noutput "h" {\n  value = <<-EOT\n    hi ${upper(local.n)}\n    EOT\n}\n'
    assert load(tmp_path, text).outputs["h"] == "hi X\n"


def test_spec_error_message_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load(tmp_path, 'locals {\n  a = local.b\n}\n')
    assert "main.hcl:2:" in str(info.value)


@pytest.mark.parametrize(("line", "want"), [("", GangMode.WHOLE_NODES),
                                            ('  gang = "whole-nodes"\n', GangMode.WHOLE_NODES),
                                            ('  gang = "packed"\n', GangMode.PACKED)])
def test_pool_gang_mode_reaches_the_pool_spec(tmp_path: Path, line: str, want: GangMode) -> None:
    """A pool's ``gang`` (default whole nodes) is the gang mode of the PoolSpec the simulator and the service use."""
    spec = load(tmp_path, POOL.replace("}\n", line + "}\n"))
    assert spec.pools["p"].gang == want.value
    assert to_pool_specs(spec)[0].gang is want
