# Hybrid capacity: an on-prem H100 pool, elastic spot H100s for rollouts (falling
# back to on-demand), a quota per team, and the learned policy with a heuristic fallback.

variable "region" {
  type    = string
  default = "us-central1" # a region the bundled market has prices for (rlsched market show)
}

variable "spot_max_nodes" {
  type    = number
  default = 8
}

locals {
  prefix = "rl-${var.region}"
  teams = {
    rl   = { pool = "onprem", gpus = 16 }
    eval = { pool = "ondemand", gpus = 8 }
  }
}

pool "onprem" {
  display_name = "${local.prefix}-onprem"
  gpu_model    = "NVIDIA H100 80GB HBM3"
  capacity     = "on_prem"
  node_count   = 4
  mig          = "disabled"

  lifecycle {
    prevent_destroy = true
  }
}

pool "spot" {
  display_name = "${local.prefix}-spot"
  gpu_model    = "H100-80GB"
  capacity     = "spot"
  region       = var.region
  node_count   = var.spot_max_nodes
  min_nodes    = 0
  max_nodes    = var.spot_max_nodes

  # a reclaimed job is checkpointed and requeued; a price cap and a named fallback pool
  # are not supported yet (README, "Pool specs")
  spot_market {
    on_preemption = "checkpoint_and_requeue"
  }
  disruption {
    drain_timeout   = "2m"
    max_unavailable = 2
  }
}

pool "ondemand" {
  display_name      = "${local.prefix}-ondemand"
  gpu_model         = "H100-80GB"
  capacity          = "on_demand"
  region            = var.region
  node_count        = 4
  cost_per_gpu_hour = 4.50
}

quota "team" {
  for_each = local.teams

  pool                  = each.value.pool
  principal             = "team:${each.key}"
  max_gpus              = each.value.gpus
  max_gpu_hours_per_day = each.value.gpus * 20
}

policy "default" {
  scheduler = "rl"
  model     = "models/ppo-mask-h100/model.zip"
  fallback  = "spot-fallback"
  weights   = { priority = 0.6, wait = 0.4 }

  health {
    max_decision_latency = "50ms"
  }
}
