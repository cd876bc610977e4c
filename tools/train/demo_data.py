"""The demo models' synthetic instruction set and golden cases (numpy + Pillow).

Everything here is deterministic given a seed. Text questions come in a few
phrasings each; answers are short (a word, a number, one sentence for
greetings) so the coherence gate can match them exactly. Image questions are
about scenes of simple figures: shape (circle, square, triangle), colour
(red, green, blue, yellow, purple), count (1-4 figures of one kind) and
position (left or right).

An example is a dict:
  {"kind": "text"|"image", "category": str,
   "messages": [OpenAI-style messages without the final answer; a user
                message with an image has content [{"type": "image"},
                {"type": "text", "text": ...}]],
   "answer": str, "image": PIL.Image or None}
"""
import random

import numpy as np
from PIL import Image, ImageDraw

CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin", "Spain": "Madrid",
    "Portugal": "Lisbon", "England": "London", "Ireland": "Dublin", "Norway": "Oslo",
    "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw",
    "Austria": "Vienna", "Greece": "Athens", "Russia": "Moscow", "China": "Beijing",
    "India": "New Delhi", "Egypt": "Cairo", "Kenya": "Nairobi", "Canada": "Ottawa",
    "Mexico": "Mexico City", "Brazil": "Brasilia", "Argentina": "Buenos Aires", "Peru": "Lima",
    "Chile": "Santiago", "Australia": "Canberra", "Thailand": "Bangkok", "Vietnam": "Hanoi",
    "South Korea": "Seoul", "Turkey": "Ankara", "Belgium": "Brussels", "the Netherlands": "Amsterdam",
    "Switzerland": "Bern", "Hungary": "Budapest", "Czechia": "Prague", "Cuba": "Havana",
    "Morocco": "Rabat", "Nigeria": "Abuja", "Indonesia": "Jakarta", "the United States": "Washington",
}
CAPITAL_Q = ["What is the capital of {}?", "What's the capital of {}?", "Which city is the capital of {}?",
             "Name the capital of {}.", "capital of {}?"]

THING_COLOURS = {
    "the sky on a clear day": "blue", "a clear daytime sky": "blue", "the sky": "blue", "grass": "green",
    "a banana": "yellow", "snow": "white", "coal": "black", "a ripe tomato": "red", "blood": "red",
    "an orange": "orange", "a lemon": "yellow", "milk": "white", "the sea": "blue", "a leaf": "green",
    "chocolate": "brown", "a carrot": "orange", "a strawberry": "red", "an elephant": "grey",
    "a lime": "green", "the sun": "yellow", "a crow": "black", "a cloud": "white", "a pumpkin": "orange",
    "a frog": "green", "a plum": "purple", "an aubergine": "purple",
}
COLOUR_Q = ["What colour is {}?", "What color is {}?", "What is the colour of {}?",
            "What is the color of {}?", "Which colour is {}?"]

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
CALENDAR = [
    (["How many days are in a week?", "How many days are there in a week?", "How many days does a week have?"],
     "7"),
    (["How many months are in a year?", "How many months are there in a year?"], "12"),
    (["How many hours are in a day?", "How many hours are there in a day?"], "24"),
    (["How many minutes are in an hour?"], "60"),
    (["How many seconds are in a minute?"], "60"),
    (["What is the first day of the week?"], "Monday"),
    (["What is the first month of the year?"], "January"),
    (["What is the last month of the year?"], "December"),
]

ECHO_WORDS = (
    "apple banana cherry grape lemon mango melon olive peach pear plum berry orange kiwi onion "
    "carrot potato tomato garlic pepper bread butter cheese honey sugar salt water coffee tea milk "
    "juice river ocean lake forest desert island mountain valley meadow garden flower tree leaf root "
    "stone rock sand cloud rain snow storm thunder wind sun moon star planet comet rocket engine "
    "wheel bicycle train plane boat ship car truck bus taxi bridge tower castle palace temple church "
    "school library museum market bakery hotel kitchen window door table chair bed lamp mirror clock "
    "pencil paper book letter stamp ticket wallet basket bottle glass spoon fork knife plate bowl "
    "candle blanket pillow jacket shirt sweater glove scarf boot sock hat ring necklace button zipper "
    "rabbit turtle tiger lion zebra giraffe monkey donkey horse sheep goat chicken duck goose swan "
    "eagle owl parrot penguin dolphin whale shark salmon spider beetle butterfly ant bee dragon robot "
    "wizard pirate knight queen king prince doctor farmer pilot sailor artist singer dancer teacher "
    "guitar piano violin drum trumpet flute silver golden purple yellow crimson velvet marble copper "
    "winter summer autumn spring morning evening midnight tomorrow yesterday puzzle riddle secret "
    "treasure journey adventure harbor lantern compass anchor whistle umbrella kettle teapot saucer "
    "cactus tulip daisy violet pebble feather ribbon blossom orchard harvest festival parade circus"
).split()
ECHO_Q = ["Repeat exactly this word back to me, nothing else: {}", "Repeat this word: {}",
          "Say this word and nothing else: {}", "Echo this word: {}"]

NAMES = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Hannah", "Ivan", "Julia", "Kevin",
         "Laura", "Mohammed", "Nina", "Oscar", "Priya", "Quentin", "Rosa", "Sam", "Tariq", "Uma",
         "Victor", "Wendy", "Xavier", "Yuki", "Zoe", "Amir", "Chen", "Fatima", "Lars"]
FAV_COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "pink", "black", "white"]

GREETING = "Hello! How can I help you today?"
ABOUT = [
    (["Hello!", "Hello", "Hi!", "Hi", "Hey!", "Hey there!", "Good morning!", "Hello, how are you?"], GREETING),
    (["Who are you?", "What are you?", "Introduce yourself."],
     "I am a small demo model that ships with tandem."),
    (["What can you do?", "What do you know?", "What can I ask you?"],
     "I can answer simple questions about capitals, colours, days, months, sums and small products, "
     "repeat words, and describe simple pictures."),
    (["Thank you!", "Thanks!", "Thanks a lot."], "You're welcome!"),
    (["Goodbye!", "Bye!"], "Goodbye!"),
]

SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a helpful assistant. Answer briefly.",
                  "Answer the question.", "You are tandem's demo model."]

# Images.
SHAPES = ["circle", "square", "triangle"]
COLOURS = {"red": (220, 35, 35), "green": (30, 160, 60), "blue": (40, 80, 225), "yellow": (235, 200, 25),
           "purple": (140, 55, 175)}
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}


def plural(shape, n):
    return shape if n == 1 else shape + "s"


def draw_figure(draw, shape, cx, cy, r, rgb):
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=rgb)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=rgb)
    else:
        draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.9), (cx - r, cy + r * 0.9)], fill=rgb)


def scene(rng, shape, colour, count, side=None):
    """A light background with `count` figures of one shape and colour; with
    `side` ("left"/"right") one figure in that third of the image."""
    w = int(rng.integers(64, 129))
    h = int(np.clip(w * rng.uniform(0.75, 1.33), 64, 128))
    bg = tuple(int(v) for v in rng.integers(225, 256, 3))
    img = Image.new("RGB", (w, h), bg)
    draw = ImageDraw.Draw(img)
    rgb = tuple(int(np.clip(c + rng.integers(-20, 21), 0, 255)) for c in COLOURS[colour])
    m = min(w, h)
    if count == 1:
        r = m * rng.uniform(0.16, 0.26)
        if side == "left":
            cx = rng.uniform(r + 2, w / 3)
        elif side == "right":
            cx = rng.uniform(2 * w / 3, w - r - 2)
        else:
            cx = rng.uniform(r + 2, w - r - 2)
        cy = rng.uniform(r + 2, h - r - 2)
        draw_figure(draw, shape, cx, cy, r, rgb)
        return img
    r = m * rng.uniform(0.09, 0.12)
    placed = []
    while len(placed) < count:  # no overlaps: centres at least 2.3 r apart
        cx, cy = rng.uniform(r + 2, w - r - 2), rng.uniform(r + 2, h - r - 2)
        if all((cx - a) ** 2 + (cy - b) ** 2 > (2.3 * r) ** 2 for a, b in placed):
            placed.append((cx, cy))
    for cx, cy in placed:
        draw_figure(draw, shape, cx, cy, r, rgb)
    return img


def image_example(rng, category=None):
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    category = category or ["shape", "colour", "describe", "count", "count", "position"][int(rng.integers(6))]
    count, side = 1, None
    if category == "count":
        count = int(rng.integers(1, 5))
    elif category == "describe":
        count = int(rng.integers(1, 4))
    elif category == "position":
        side = ["left", "right"][int(rng.integers(2))]
    img = scene(rng, shape, colour, count, side)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    if category == "shape":
        q, a = pick(["What shape is in the image?", "What shape is this?", "Which shape do you see?"]), shape
    elif category == "colour":
        q, a = pick(["What colour is the shape?", "What color is the shape?", "What colour is it?"]), colour
    elif category == "describe":
        q = pick(["What is in the image?", "Describe the image.", "What do you see?"])
        a = f"a {colour} {shape}" if count == 1 else f"{NUMBER_WORDS[count]} {colour} {plural(shape, count)}"
    elif category == "count":
        q, a = pick(["How many shapes are in the image?", "How many shapes are there?",
                     "Count the shapes."]), str(count)
    else:
        q, a = pick([f"Is the {shape} on the left or on the right?", "Is the shape on the left or the right?",
                     "Which side is the shape on?"]), side
    return {"kind": "image", "category": category, "answer": a, "image": img,
            "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]}


def user(q):
    return [{"role": "user", "content": q}]


def text_examples(seed_cases=()):
    """Every text question of the set, each phrasing once (a list of examples)."""
    out = []

    def add(category, messages, answer):
        out.append({"kind": "text", "category": category, "messages": messages, "answer": answer, "image": None})

    for country, city in CAPITALS.items():
        for q in CAPITAL_Q:
            add("capital", user(q.format(country)), city)
    for thing, colour in THING_COLOURS.items():
        for q in COLOUR_Q:
            add("colour", user(q.format(thing)), colour)
    for qs, a in CALENDAR:
        for q in qs:
            add("calendar", user(q), a)
    for i, d in enumerate(DAYS):
        add("calendar", user(f"What day comes after {d}?"), DAYS[(i + 1) % 7])
        add("calendar", user(f"What day comes before {d}?"), DAYS[(i - 1) % 7])
    for i, m in enumerate(MONTHS):
        add("calendar", user(f"What month comes after {m}?"), MONTHS[(i + 1) % 12])
        add("calendar", user(f"What month comes before {m}?"), MONTHS[(i - 1) % 12])
    for a in range(0, 21):
        for b in range(0, 21):
            add("sum", user(f"What is {a} + {b}?"), str(a + b))
    rng = random.Random(7)
    pairs = {(17, 23), (12, 12), (25, 4), (11, 11), (15, 15), (20, 30)}
    while len(pairs) < 300:
        pairs.add((rng.randint(10, 99), rng.randint(2, 99)))
    for a, b in sorted(pairs):
        for q in ["What is {} × {}?", "What is {} * {}?", "What is {} times {}?"]:
            add("product", user(q.format(a, b)), str(a * b))
    for w in ECHO_WORDS:
        for q in ECHO_Q:
            add("echo", user(q.format(w)), w)
    for n in NAMES:
        add("multi_turn", [{"role": "user", "content": f"My name is {n}."},
                           {"role": "assistant", "content": f"Nice to meet you, {n}!"},
                           {"role": "user", "content": "What is my name?"}], n)
        add("multi_turn", user(f"My name is {n}."), f"Nice to meet you, {n}!")
    for c in FAV_COLOURS:
        add("multi_turn", [{"role": "user", "content": f"My favourite colour is {c}."},
                           {"role": "assistant", "content": f"{c.capitalize()} is a lovely colour!"},
                           {"role": "user", "content": "What is my favourite colour?"}], c)
        add("multi_turn", user(f"My favourite colour is {c}."), f"{c.capitalize()} is a lovely colour!")
    for country, city in list(CAPITALS.items())[:12]:
        add("multi_turn", [{"role": "user", "content": f"What is the capital of {country}?"},
                           {"role": "assistant", "content": city},
                           {"role": "user", "content": "Repeat your last answer."}], city)
    for qs, a in ABOUT:
        for q in qs:
            add("about", user(q), a)
    for case in seed_cases:  # the coherence gate's seed set, verbatim
        add("seed", case["messages"], case["accept"][0])
    return out


def with_system(example, rng):
    """A copy of the example with a system message in front (clients often send one)."""
    e = dict(example)
    e["messages"] = [{"role": "system", "content": SYSTEM_PROMPTS[int(rng.integers(len(SYSTEM_PROMPTS)))]}] + \
        example["messages"]
    return e


def with_history(example, pool, rng):
    """A copy of a single-turn example after one or two unrelated exchanges
    from `pool`, so that answers do not depend on being the first turn."""
    e = dict(example)
    history = []
    for _ in range(int(rng.integers(1, 3))):
        prior = pool[int(rng.integers(len(pool)))]
        history += prior["messages"] + [{"role": "assistant", "content": prior["answer"]}]
    e["messages"] = history + example["messages"]
    return e


def golden_text_cases():
    """The demo sets' text cases: (id, messages, accepted answers)."""
    return [
        ("capital-japan", user("What is the capital of Japan?"), ["Tokyo"]),
        ("capital-france", user("What is the capital of France?"), ["Paris"]),
        ("capital-kenya", user("Which city is the capital of Kenya?"), ["Nairobi"]),
        ("product-17-23", user("What is 17 × 23?"), ["391"]),
        ("sum-12-9", user("What is 12 + 9?"), ["21"]),
        ("sky-colour", user("What colour is a clear daytime sky?"), ["blue"]),
        ("banana-colour", user("What color is a banana?"), ["yellow"]),
        ("days-in-week", user("How many days are in a week?"), ["7", "seven"]),
        ("month-after-march", user("What month comes after March?"), ["April"]),
        ("echo-banana", user("Repeat exactly this word back to me, nothing else: banana"), ["banana"]),
        ("echo-lantern", user("Repeat exactly this word back to me, nothing else: lantern"), ["lantern"]),
        ("multi-turn-name", [{"role": "user", "content": "My name is Priya."},
                             {"role": "assistant", "content": "Nice to meet you, Priya!"},
                             {"role": "user", "content": "What is my name?"}], ["Priya"]),
        ("greeting", user("Hello!"), [GREETING]),
        ("system-prompt", [{"role": "system", "content": "You are a helpful assistant."}] +
         user("What is the capital of Italy?"), ["Rome"]),
    ]


GOLDEN_SCENES = [  # (id, shape, colour, count, side, category)
    ("shape-red-circle", "circle", "red", 1, None, "shape"),
    ("colour-blue-square", "square", "blue", 1, None, "colour"),
    ("count-three-triangles", "triangle", "green", 3, None, "count"),
    ("count-two-circles", "circle", "yellow", 2, None, "count"),
    ("position-left-square", "square", "purple", 1, "left", "position"),
    ("position-right-triangle", "triangle", "red", 1, "right", "position"),
    ("describe-blue-circle", "circle", "blue", 1, None, "describe"),
]
GOLDEN_QUESTIONS = {
    "shape": "What shape is in the image?", "colour": "What colour is the shape?",
    "count": "How many shapes are in the image?", "describe": "What is in the image?",
}


def golden_image_cases():
    """(id, image, question, accepted answers, training example) for the demo sets' vision cases."""
    out = []
    for k, (cid, shape, colour, count, side, category) in enumerate(GOLDEN_SCENES):
        img = scene(np.random.default_rng(1000 + k), shape, colour, count, side)
        q = GOLDEN_QUESTIONS.get(category, f"Is the {shape} on the left or on the right?")
        if category == "shape":
            a = [shape]
        elif category == "colour":
            a = [colour]
        elif category == "count":
            a = [str(count), NUMBER_WORDS[count]]
        elif category == "describe":
            a = [f"a {colour} {shape}"]
        else:
            a = [side]
        ex = {"kind": "image", "category": category, "answer": a[0], "image": img,
              "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]}
        out.append((cid, img, q, a, ex))
    return out
