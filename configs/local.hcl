# A single workstation: one node, its GPUs used whole (no MIG, no time-slicing).
# rlsched validate configs/local.hcl
# rlsched simulate --pools configs/local.hcl ...

variable "gpus" {
  type        = number
  default     = 1
  description = "GPUs in this machine."

  validation {
    condition     = var.gpus >= 1 && var.gpus <= 8
    error_message = "A local node has between 1 and 8 GPUs."
  }
}

variable "gpu_model" {
  type    = string
  default = "NVIDIA A100-SXM4-80GB" # as nvidia-smi prints it
}

pool "local" {
  display_name  = "this machine"
  gpu_model     = var.gpu_model
  capacity      = "on_prem"
  nodes         = ["localhost"]
  gpus_per_node = var.gpus
  mig           = "disabled"

  disruption {
    drain_timeout   = "5m"
    max_unavailable = 1
  }
}

policy "default" {
  scheduler = "fifo"
  fallback  = "fifo"
}
