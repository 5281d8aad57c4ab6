"""A scorer that always returns 0: every group has no reward spread (tests/fault/test_diagnosis.py)."""


def score(completion: str, reference, payload: dict) -> float:
    return 0.0
