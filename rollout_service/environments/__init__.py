"""Adapters for environments people already have: each runs an existing environment library's own rollout
and reward, unmodified, as a jetrl entry agent (`rollout.workflow: agent`, `workflow_args.entry`, docs/agents.md)
against the rollout worker's OpenAI-compatible endpoint.

openenv_env     OpenEnv environment servers (openenv-core): the entry function `run`
tau2_env        τ²-bench domains (installed from its git repository): the entry function `run`
tau2_data       `python -m rollout_service.environments.tau2_data`: a τ²-bench domain's tasks as jetrl rows
verifiers_env   verifiers environments (prime-rl's environment library): the entry function `run`
verifiers_data  `python -m rollout_service.environments.verifiers_data`: a verifiers environment's dataset as
                jetrl's train.jsonl / heldout.jsonl
"""
