"""A small OpenEnv environment for jetrl's OpenEnv adapter (rollout_service/environments/openenv_env.py):
"guess the number", written against openenv-core's own classes (`Environment`, `Action`, `Observation`,
`State`) and served by its own app factory (`create_app`), nothing jetrl-specific in it.

    pip install "openenv-core==0.3.0"
    python -m examples.openenv_env.server --port 8765          # serves /ws, /reset, /step, /state, /schema
    python -m examples.openenv_env.data --out examples/data/openenv   # the prompt rows (already shipped)

models.py       GuessAction (guess: int), GuessObservation (message, low, high, guesses_left), GuessState
environment.py  GuessEnvironment: reset(seed, low, high, max_guesses) draws the secret with random.Random(seed);
                step() says "Too low." / "Too high."; reward 1.0 for the right guess (episode done),
                -0.1 for a guess outside low..high, else 0.0; done when the guesses run out
server.py       the FastAPI app from openenv's create_app, under uvicorn
data.py         train / held-out rows (seeds) for examples/data/openenv/
"""
