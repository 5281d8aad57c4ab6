"""The wire contract every service speaks: subjects (names), messages (dataclasses), codec (msgpack),
bus (connect, streams, publish) and consumer (the durable consumer loop and its delivery guarantees). docs/protocol.md is its reference. Nothing here imports torch (tested)."""
