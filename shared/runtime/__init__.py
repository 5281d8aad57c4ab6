"""The process and security kit: the embedded nats-server (natsd) and one NATS user per service
(nats_permissions), the bubblewrap sandbox (sandbox) and its cgroups (sandbox_cgroup), bearer auth (auth),
secrets (credentials), a child that dies with its parent (parent_death), logging and metrics (telemetry)
and the CLI helpers every service's command uses (cliutil)."""
