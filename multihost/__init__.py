"""Multi-host tooling for tests, benchmarks and people: hosts as network namespaces (netns.py), a NATS
cluster across them (shared/runtime/natsd.py ClusterSpec) and the run spread over hosts (spread.py)."""
