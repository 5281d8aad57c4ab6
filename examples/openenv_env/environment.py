"""GuessEnvironment: guess a secret whole number in low..high within max_guesses, told "Too low." or
"Too high." after each wrong guess. An openenv `Environment` subclass; deterministic given the reset seed.

Rewards (per step, on the observation as OpenEnv carries them):
  1.0   the right guess (the episode is done)
 -0.1   a guess outside low..high (a wasted guess)
  0.0   any other wrong guess
The episode is also done when no guesses are left. A step after the end changes nothing and gives 0.0.
"""

from __future__ import annotations

import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment

from .models import GuessAction, GuessObservation, GuessState

RIGHT, OUT_OF_RANGE, WRONG = 1.0, -0.1, 0.0


def secret_for(seed: int | None, low: int, high: int) -> int:
    """The secret of a game: the first draw of random.Random(seed) in low..high."""
    return random.Random(seed).randint(low, high)


def _left(n: int) -> str:
    return f"{n} guess left." if n == 1 else f"{n} guesses left."


class GuessEnvironment(Environment[GuessAction, GuessObservation, GuessState]):
    # every WebSocket session gets its own instance and the instances share nothing, so the server may run
    # many sessions at once (create_app's max_concurrent_envs > 1 requires this flag)
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._start(None, 1, 9, 3, None)

    def _start(self, seed: int | None, low: int, high: int, max_guesses: int, episode_id: str | None) -> None:
        if low > high:
            raise ValueError(f"low {low} is above high {high}")
        if max_guesses < 1:
            raise ValueError(f"max_guesses must be at least 1, not {max_guesses}")
        self._state = GuessState(episode_id=episode_id or str(uuid4()), step_count=0,
                                 secret=secret_for(seed, low, high), low=low, high=high, max_guesses=max_guesses)

    def _observation(self, message: str, reward: float | None, done: bool) -> GuessObservation:
        s = self._state
        return GuessObservation(message=message, low=s.low, high=s.high, guesses_left=s.max_guesses - len(s.guesses),
                                reward=reward, done=done)

    def reset(self, seed: int | None = None, episode_id: str | None = None, low: int = 1, high: int = 9,
              max_guesses: int = 3, **kwargs: Any) -> GuessObservation:
        self._start(seed, int(low), int(high), int(max_guesses), episode_id)
        s = self._state
        return self._observation(f"Guess my number from {s.low} to {s.high}. {_left(s.max_guesses)}", None, False)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        s = self._state
        if s.won or len(s.guesses) >= s.max_guesses:
            return self._observation("The game is over.", 0.0, True)
        s.step_count += 1
        g = action.guess
        s.guesses.append(g)
        left = s.max_guesses - len(s.guesses)
        if g == s.secret:
            s.won = True
            return self._observation(f"Right! It was {s.secret}.", RIGHT, True)
        if not s.low <= g <= s.high:
            reward, msg = OUT_OF_RANGE, f"{g} is out of range ({s.low} to {s.high})."
        else:
            reward, msg = WRONG, "Too low." if g < s.secret else "Too high."
        if left == 0:
            return self._observation(f"{msg} No guesses left; it was {s.secret}.", reward, True)
        return self._observation(f"{msg} {_left(left)}", reward, False)

    @property
    def state(self) -> GuessState:
        return self._state
