"""Test and benchmark support, not shipped in the wheel: tests/, bench/ and multihost/ import it; no
service, shared/ or the launcher does (tests/shared/test_import_wall.py).

    fault_scenario.py   the fault suite's scenario: a run through every service, a fault injected, the
                        lineage and recovery checked (tests/fault, bench/fault_recovery.py, multihost)
    devpg.py            a throwaway PostgreSQL server (initdb + pg_ctl on a free port) for the controller's
                        database tests and bench/controller_release.py
"""
