"""Terraform-style state, refresh, diff, plan rendering and apply over a GPU backend."""
