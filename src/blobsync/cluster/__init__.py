"""One job run across many machines: engine-neutral shard specs and work (spec, work), and the Dask adapter."""
