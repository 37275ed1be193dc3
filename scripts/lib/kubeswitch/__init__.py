"""The pieces of scripts/kube-switch.py: the stores a cluster moves between (stores.py), the
cluster on them (cluster.py) and what is reported (report.py)."""
