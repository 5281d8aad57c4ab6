"""reward_service: scoring behind NATS request/reply (docs/reward.md).

service.py (the NATS micro service) · engine.py (decode, check, score: shared by service, offline and
bench) · pool.py (killable process pool) · client.py (RewardClient) · scorers/ (one module per task)
· offline.py (`jetrl reward score`) · check.py (`jetrl reward check`) · examples/node/ (Node.js service).
"""
