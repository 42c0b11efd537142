"""Pool specs in HCL: parse (python-hcl2), evaluate, check the schema, report diagnostics."""
