"""The demo model's world: a generated corpus of small facts, arithmetic and conversations.

Everything is produced from tables in this file with a seeded generator, so the corpus (and the
model trained on it) can be rebuilt exactly. Questions come in several phrasings; answers are
short full sentences, so a model of about a million parameters can learn them and a few minutes
of LoRA training can visibly change them.
"""

from __future__ import annotations

import random

CAPITALS = {
    "france": "paris", "spain": "madrid", "italy": "rome", "germany": "berlin", "japan": "tokyo",
    "egypt": "cairo", "peru": "lima", "kenya": "nairobi", "canada": "ottawa", "china": "beijing",
    "greece": "athens", "norway": "oslo", "poland": "warsaw", "cuba": "havana", "chile": "santiago",
    "india": "delhi", "russia": "moscow", "sweden": "stockholm", "portugal": "lisbon", "austria": "vienna",
}  # fmt: skip
COLORS = {
    "the sky": "blue", "grass": "green", "snow": "white", "a banana": "yellow", "coal": "black",
    "a tomato": "red", "an orange": "orange", "the sun": "yellow", "milk": "white", "a leaf": "green",
    "blood": "red", "the sea": "blue", "a lemon": "yellow", "chocolate": "brown", "a cherry": "red",
}  # fmt: skip
SOUNDS = {
    "a dog": "barks", "a cat": "meows", "a cow": "moos", "a duck": "quacks", "a lion": "roars",
    "a sheep": "bleats", "a horse": "neighs", "a bird": "sings", "a snake": "hisses", "a frog": "croaks",
    "a pig": "oinks", "an owl": "hoots",
}  # fmt: skip
OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "up": "down", "day": "night", "happy": "sad",
    "old": "new", "light": "dark", "open": "closed", "early": "late", "full": "empty", "hard": "soft",
    "high": "low", "long": "short", "wet": "dry", "loud": "quiet",
}  # fmt: skip
NUMBERS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",
]  # fmt: skip
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
SYSTEMS = ["You are a helpful assistant.", "You are a friendly assistant. Answer in one sentence.",
           "Answer the question."]  # fmt: skip


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def qa_pairs(rng: random.Random) -> list[tuple[str, str]]:
    """Every fact of the world as (question, answer), each in one of several phrasings."""
    out = []
    for country, city in CAPITALS.items():
        q = rng.choice(["What is the capital of {c}?", "Which city is the capital of {c}?",
                        "Tell me the capital of {c}.", "What city is the capital of {c}?"])  # fmt: skip
        out.append((q.format(c=_cap(country)), f"The capital of {_cap(country)} is {_cap(city)}."))
    for thing, color in COLORS.items():
        q = rng.choice(["What color is {t}?", "Which color is {t}?", "Tell me the color of {t}."])
        out.append((q.format(t=thing), f"{_cap(thing)} is {color}."))
    for animal, sound in SOUNDS.items():
        q = rng.choice(["What does {a} say?", "What sound does {a} make?", "How does {a} sound?"])
        out.append((q.format(a=animal), f"{_cap(animal)} {sound}."))
    for word, opposite in OPPOSITES.items():
        q = rng.choice(["What is the opposite of {w}?", "Give me the opposite of {w}.",
                        "Which word is the opposite of {w}?"])  # fmt: skip
        out.append((q.format(w=word), f"The opposite of {word} is {opposite}."))
        out.append((q.format(w=opposite), f"The opposite of {opposite} is {word}."))
    for a in range(11):
        for b in range(11):
            if a + b <= 20 and rng.random() < 0.5:
                q = rng.choice(["What is {a} plus {b}?", "How much is {a} plus {b}?", "Add {a} and {b}."])
                out.append((q.format(a=a, b=b), f"{a} plus {b} is {a + b}."))
    for n in range(20):
        q = rng.choice(["What number comes after {n}?", "Which number follows {n}?", "What comes after {w}?"])
        out.append((q.format(n=n, w=NUMBERS[n]), f"After {n} comes {n + 1}."))
    for i, d in enumerate(DAYS):
        q = rng.choice(["What day comes after {d}?", "Which day follows {d}?"])
        out.append((q.format(d=_cap(d)), f"After {_cap(d)} comes {_cap(DAYS[(i + 1) % 7])}."))
    greetings = [("Hello!", "Hello! How can I help you?"), ("Hi.", "Hi! What would you like to know?"),
                 ("Who are you?", "I am a small assistant. I know simple facts."),
                 ("What is your name?", "I am the Tune Studio demo model."),
                 ("Thank you!", "You are welcome!"), ("Goodbye.", "Goodbye! Have a nice day.")]  # fmt: skip
    out.extend(greetings)
    return out


def conversations(n: int, seed: int = 0) -> list[list[dict]]:
    """n chat conversations of one to three question/answer turns, some with a system message."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        facts = qa_pairs(rng)
        turns = rng.choice([1, 1, 2, 3])
        msgs: list[dict] = []
        if rng.random() < 0.3:
            msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
        for q, a in rng.sample(facts, turns):
            msgs.append({"role": "user", "content": q})
            msgs.append({"role": "assistant", "content": a})
        out.append(msgs)
    return out


def all_text_for_tokenizer(seed: int = 0) -> list[str]:
    """Every sentence the world can say, for training the tokenizer (covers all phrasings)."""
    texts = []
    for s in range(8):
        for q, a in qa_pairs(random.Random(seed + s)):
            texts.append(q)
            texts.append(a)
    texts.extend(SYSTEMS)
    return texts
