variable "region" {
  type    = string
  default = "us-east"
}

variable "train_nodes" {
  type    = list(string)
  default = ["gpu-h100-01", "gpu-h100-02", "gpu-h100-03"]

  validation {
    condition     = length(var.train_nodes) >= 2
    error_message = "The training pool needs at least two nodes."
  }
}

locals {
  prefix        = "rl-${var.region}"
  rollout_nodes = ["gpu-h100-04", "gpu-h100-05"]
}

mig_layout "balanced" {            # mig-parted vocabulary: profile -> count
  devices = { "1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1 }
}

pool "train" {
  display_name = "${local.prefix}-train"
  gpu_model    = "NVIDIA H100 80GB HBM3"
  capacity     = "on_demand"
  nodes        = var.train_nodes
  mig          = "disabled"

  disruption {
    drain_timeout   = "15m"
    max_unavailable = 1
  }
  lifecycle {
    prevent_destroy = true
  }
}

pool "rollout" {
  gpu_model  = "NVIDIA H100 80GB HBM3"
  capacity   = "spot"
  nodes      = local.rollout_nodes
  mig_layout = mig_layout.balanced

  spot_market {
    max_price_per_gpu_hour = 2.10
    on_preemption          = "checkpoint_and_requeue"
    fallback_pool          = pool.train
  }
  disruption {
    drain_timeout   = "5m"
    max_unavailable = 1
  }
}

quota "team_rl" {
  pool       = pool.rollout
  principal  = "team:rl"
  max_slices = { "1g.10gb" = 4, "3g.40gb" = 2 }
}

policy "default" {
  scheduler  = "rl"
  checkpoint = "models/ppo-mask-h100/model.zip"
  fallback   = "weighted_priority"
  weights    = { priority = 0.6, wait = 0.4 }

  health {
    max_decision_latency = "50ms"
    min_success_rate     = 0.95
  }
}
