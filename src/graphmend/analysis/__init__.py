"""Static analysis of module source, for the rewrites: scopes (what a name refers to),
bindings (which names are bound or live where), purity (what reads tensor data),
speculation (what may run on an untaken branch) and output calls (print, logging,
warnings)."""
