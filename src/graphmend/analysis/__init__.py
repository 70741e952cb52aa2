"""Static analysis of module source: scopes, output calls."""
