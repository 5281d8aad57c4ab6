"""What two or more services need, and nothing that names a service (tests/shared/test_import_wall.py).

    shared/contract/   the wire contract: subjects, messages, codec, bus, consumer. Imports no torch (tested).
    shared/config/     the typed run config: every section, the YAML loader, a.b.c=value overrides.
                       Imports no torch (tested).
    shared/model/      the model kit: tiny test models, LoRA adapters, the logits mask, GGUF import (torch).
    shared/runtime/    the process and security kit: embedded nats-server and its per-service users,
                       bubblewrap sandbox and its cgroups, bearer auth, credentials, parent death,
                       logging and metrics, CLI helpers.
    shared/io/         files: JSON-lines reading, hard-linked version trees.

Users' extension points (workflows, tools, scorers, agents, engines) are imported from `jetrl_api`.
"""

__version__ = "0.13.0"
