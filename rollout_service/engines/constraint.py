"""Constrained decoding: a grammar that every sampled token must keep the output inside.

A `Constraint` travels in SamplingParams. Its kind is what the engines understand:

- `json_schema`: the output is one JSON value that validates against `value` (a JSON schema; OpenAI's
  response_format json_object is the schema {"type": "object"});
- `lark`: the output matches `value`, a grammar in llguidance's Lark dialect (which can embed JSON schemas
  with `%json {...}`): the agent endpoint forces tool calls with one (agents/constrain.py).

The local engine enforces it with llguidance (`GrammarMatcher`): before each draw the tokens the grammar
does not allow get the shared logits mask (shared/model/logits_mask.py), so the sampled token and its recorded
logprob come from the same masked distribution; once the grammar is complete only EOS is allowed, and a
grammar that can go no further ends the sequence ("stop"). JSON is laid out as `json.dumps` lays it out
(", " and ": ", no other whitespace): a schema-valid value is then always reachable in few tokens.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import torch

# json.dumps' layout: without free whitespace a (small) model cannot wander off in blanks
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KINDS = ("json_schema", "lark")


@dataclass(frozen=True)
class Constraint:
    kind: str  # json_schema | lark
    value: Any  # the schema (a dict) or the Lark grammar (a str)

    def grammar(self) -> str:
        """The llguidance grammar (a JSON string) of this constraint."""
        import llguidance

        if self.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(self.value, defaults=JSON_LAYOUT)
        if self.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(self.value)
        raise ValueError(f"constraint kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def check(self) -> None:
        """ValueError with llguidance's reason when the grammar (or schema) cannot be compiled."""
        import llguidance

        try:
            grammar = self.grammar()
        except ValueError as exc:
            raise ValueError(f"the {self.kind} is not valid: {exc}") from None
        bad, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if bad:
            raise ValueError(f"the {self.kind} is not supported: {warnings}")


def json_schema_lark(schema: dict) -> str:
    """`%json {...}` for a Lark rule, with JSON_LAYOUT."""
    return "%json " + json.dumps({**schema, "x-guidance": {**JSON_LAYOUT, **schema.get("x-guidance", {})}})


_TOKENIZERS: dict[tuple[int, int], Any] = {}
_LOCK = threading.Lock()


def grammar_tokenizer(tokenizer: Any, vocab_size: int):
    """llguidance's view of a Hugging Face tokenizer (built once per tokenizer and vocabulary size: ~1 s for
    a 50k vocabulary). Tokenizers llguidance cannot read from their JSON (e.g. a `Fuse` decoder) are given
    as the bytes each token id decodes to, special tokens marked with llguidance's 0xFF prefix."""
    import llguidance
    import llguidance.hf

    key = (id(tokenizer), vocab_size)
    with _LOCK:
        if key not in _TOKENIZERS:
            try:
                lt = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
            except ValueError:
                lt = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocab(tokenizer, vocab_size)))
            _TOKENIZERS[key] = lt
        return _TOKENIZERS[key]


class _ByteVocab:
    """The token -> bytes table llguidance.TokenizerWrapper takes, read from a tokenizer id by id."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        self.tok = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.special_token_ids = sorted(special)
        self.tokens = []
        for i in range(vocab_size):
            if i >= len(tokenizer):
                self.tokens.append(b"\xff[UNUSED_" + str(i).encode() + b"]")
            elif i in special:
                self.tokens.append(b"\xff" + str(tokenizer.convert_ids_to_tokens(i)).encode())
            else:
                self.tokens.append(tokenizer.decode([i]).encode())

    def __call__(self, s: str) -> list[int]:
        return list(self.tok.encode(s, add_special_tokens=False))


class GrammarMatcher:
    """One sequence's grammar state: the mask of the tokens it allows next, advanced token by token."""

    def __init__(self, constraint: Constraint, tokenizer: Any, vocab_size: int):
        import llguidance

        self.vocab = vocab_size
        self.m = llguidance.LLMatcher(grammar_tokenizer(tokenizer, vocab_size), constraint.grammar())
        if self.m.is_error():
            raise ValueError(f"the {constraint.kind} is not supported: {self.m.get_error()}")
        self._bits = torch.arange(32, dtype=torch.int32)

    def allowed(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[V] bool: the tokens the grammar allows next (EOS once it is complete)."""
        words = torch.frombuffer(bytearray(self.m.compute_bitmask()), dtype=torch.int32)
        bits = ((words[:, None] >> self._bits[None, :]) & 1).bool().reshape(-1)[: self.vocab]
        return bits.to(device)

    def consume(self, token: int) -> bool:
        """Advance by the sampled token; False when the grammar is done (stopped) or refused it."""
        ok = self.m.consume_token(int(token))
        return bool(ok) and not self.m.is_stopped() and not self.m.is_error()
