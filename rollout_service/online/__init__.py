"""Online training: outside traffic calls the policy through sessions rewarded later (`jetrl serve-policy`).

keys.py     client applications' keys, from 0600 files, re-read when they change
limits.py   per-application request, token and open-session limits
records.py  a session's record on NATS (the KV bucket jetrl_sessions): it outlives the worker
groups.py   rewarded sessions -> trajectory groups (a caller's group key, or a moving baseline)
server.py   the endpoint: sessions, their OpenAI-compatible routes, rewards, expiry
"""
