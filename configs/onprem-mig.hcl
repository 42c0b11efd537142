# An on-prem H100 rack split by MIG: inference nodes run many small instances,
# training nodes a 4g + 3g split. Layouts use mig-parted's vocabulary (profile -> count).

variable "racks" {
  description = "Node hostnames per role."
  type        = map(list(string))
  default = {
    infer = ["gpu-h100-01", "gpu-h100-02"]
    train = ["gpu-h100-03", "gpu-h100-04"]
  }
}

locals {
  model = "NVIDIA H100 80GB HBM3"
  layouts = {
    infer = mig_layout.all_small
    train = mig_layout.mixed
  }
}

mig_layout "all_small" {
  devices = { "1g.10gb" = 7 } # seven isolated 10 GB instances
}

mig_layout "mixed" {
  devices = { "4g.40gb" = 1, "3g.40gb" = 1 }
}

/* One pool per role; for_each keys pools by name, so removing one role never
   renumbers (and drains) the other. */
pool "h100" {
  for_each = var.racks

  display_name      = "H100 ${each.key}"
  gpu_model         = local.model
  capacity          = "on_prem"
  nodes             = each.value
  gpus_per_node     = 8
  mig_layout        = local.layouts[each.key]
  cost_per_gpu_hour = 1.10 // amortised

  disruption {
    drain_timeout   = "15m"
    max_unavailable = 1
  }
  lifecycle {
    prevent_destroy = true
  }
}

quota "interns" {
  pool       = pool.h100["infer"]
  principal  = "group:interns"
  max_slices = { "1g.10gb" = 4 }
}

policy "default" {
  scheduler = "fgd"
  fallback  = "best_fit"
}

output "mig_nodes" {
  value = flatten(values(var.racks))
}
