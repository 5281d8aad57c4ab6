"""The guessing game's wire types, as OpenEnv environments declare them (pydantic models over openenv's
Action / Observation / State; `extra="forbid"` comes from openenv's base classes)."""

from __future__ import annotations

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    """One guess."""

    guess: int = Field(..., description="The number you guess (a whole number).")


class GuessObservation(Observation):
    """What the player is told (OpenEnv adds `done`, `reward` and `metadata`; metadata never goes on the wire)."""

    message: str = Field("", description="What the game says, e.g. 'Too low. 2 guesses left.'")
    low: int = Field(1, description="Smallest possible secret.")
    high: int = Field(9, description="Largest possible secret.")
    guesses_left: int = Field(0, ge=0, description="Guesses still allowed.")


class GuessState(State):
    """The game's internal state (GET /state, or a `state` message on the WebSocket)."""

    secret: int = 0
    low: int = 1
    high: int = 9
    max_guesses: int = 3
    guesses: list[int] = Field(default_factory=list)
    won: bool = False
