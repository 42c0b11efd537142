# The README's pool-spec walk-through: GPUs 0 and 1 of one H100 node in MIG mode, split
# 2x1g.10gb + 2g.20gb + 3g.40gb. Try it on a simulated fleet: rlsched inventory init --nodes 2x8xH100-80GB.

mig_layout "balanced" {
  devices = { "1g.10gb" = 2, "2g.20gb" = 1, "3g.40gb" = 1 }
}

pool "infer" {
  gpu_model  = "H100-80GB"
  capacity   = "on_prem"
  nodes      = ["gpu-h100-01"]
  gpus       = [0, 1]
  mig_layout = mig_layout.balanced

  disruption {
    drain_timeout = "5m"
  }
}
