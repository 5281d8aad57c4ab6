"""The search agent's data: a generated corpus of short passages and two-hop questions over it.

Everything is synthetic (made-up people, towns and countries from fixed name lists and a seed), so there
is no licence to mind and no model has seen the answers: "In which country was Mira Olven born?" needs
one search for the person (born in a town) and one for the town (in a country). Distractor passages
(jobs, rivers) make a lazy single search insufficient.

    python examples/agents/search/data.py --out search-data      # corpus.jsonl, train.jsonl, heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

FIRST = ["Mira", "Tomas", "Ilse", "Orin", "Petra", "Bram", "Selma", "Kael", "Nadia", "Ruben", "Ysolde", "Emil",
         "Greta", "Lior", "Anouk", "Dario", "Freya", "Jonas", "Talia", "Viktor"]
LAST = ["Olven", "Marsh", "Quill", "Brenner", "Castell", "Dunmore", "Eskel", "Farrow", "Galen", "Hollis",
        "Ivers", "Jansky", "Korda", "Lindqvist", "Morrow", "Nyberg", "Osric", "Pelham", "Ravel", "Sorensen"]
TOWN_A = ["Bel", "Cor", "Dra", "Fen", "Gal", "Hal", "Kes", "Lun", "Mor", "Nal", "Ost", "Pra", "Ril", "Sov", "Tar"]
TOWN_B = ["dorf", "mere", "wick", "hollow", "stead", "ford", "gate", "haven", "moor", "ton"]
COUNTRIES = ["Belmoria", "Caldoria", "Drevania", "Estovia", "Falkreth", "Gorvania", "Halvoria", "Istrana"]
JOBS = ["baker", "ferry pilot", "clockmaker", "archivist", "beekeeper", "glassblower", "cartographer"]
RIVERS = ["Aule", "Brisk", "Corran", "Dulse", "Eyre", "Fane"]


def make_world(seed: int = 0, people: int = 300, towns: int = 60) -> tuple[list[dict], list[dict]]:
    """(passages, questions): passages {"title", "text"}; questions {"prompt", "reference", "metadata"}."""
    rng = random.Random(seed)
    names = rng.sample([f"{a}{b}" for a in TOWN_A for b in TOWN_B], towns)
    town_country = {t: rng.choice(COUNTRIES) for t in names}
    passages = []
    for t, c in town_country.items():
        passages.append({"title": t, "text": f"{t} is a town in {c}."})
        passages.append({"title": t, "text": f"{t} lies on the river {rng.choice(RIVERS)}."})
    persons = rng.sample([f"{a} {b}" for a in FIRST for b in LAST], people)
    questions = []
    for p in persons:
        town = rng.choice(names)
        passages.append({"title": p, "text": f"{p} was born in {town}."})
        passages.append({"title": p, "text": f"{p} works as a {rng.choice(JOBS)} in {rng.choice(names)}."})
        questions.append({"prompt": f"In which country was {p} born?", "reference": town_country[town],
                          "metadata": {"person": p, "town": town}})
    rng.shuffle(passages)
    return passages, questions


def write(out: str | Path, seed: int = 0, heldout: int = 50) -> dict[str, Path]:
    """Write corpus.jsonl, train.jsonl and heldout.jsonl into `out`; each question's metadata names the
    corpus (absolute path), so the agent finds it."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    passages, questions = make_world(seed)
    paths = {"corpus": d / "corpus.jsonl", "train": d / "train.jsonl", "heldout": d / "heldout.jsonl"}
    for q in questions:
        q["metadata"]["corpus"] = str(paths["corpus"].resolve())
    for name, rows in (("corpus", passages), ("train", questions[heldout:]), ("heldout", questions[:heldout])):
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="search-data")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for name, path in write(args.out, args.seed).items():
        print(f"{name}: {path}")
