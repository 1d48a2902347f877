"""Code generation: the docs' generated pages, the API's kube types and the chart's admission policy,
each from its registry or model (`make generate`)."""
