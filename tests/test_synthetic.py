"""The built-in multilingual scene data: determinism, splits, counts, sharding,
scripts, grammar (hand-written captions) and what the pixels show."""

import collections
import unicodedata

import numpy as np
import pytest

from mural import config_lib
from mural.data import sources as sources_lib
from mural.data import synthetic as S
from mural.data import synthetic_grammars as grammars
from mural.data import synthetic_render as rendering
from mural.data import synthetic_scenes as scenes
from mural.data import synthetic_settings as settings_lib

O = scenes.Obj


def _config(size=16, **fields):
  c = config_lib.base_config()
  c.data.synthetic.render_size = size
  c.data.synthetic.eval_scenes = 40
  for k, v in fields.items():
    c.data.synthetic[k] = v
  return c


def _settings(**fields):
  return settings_lib.Settings.from_config(_config(**fields))


def _random_descriptions(n, seed=0, heldout=False):
  rng = np.random.default_rng(seed)
  return [scenes.sample_description(rng, heldout, 0.1) for _ in range(n)]


# ---- Languages and grammar -------------------------------------------------

def test_languages_scripts_and_config_agree():
  assert set(grammars.SCRIPTS) == set(grammars.LANGUAGES)
  assert len(set(grammars.SCRIPTS.values())) >= 5  # Latin, Cyrillic, Japanese, Devanagari, Ethiopic.
  assert set(config_lib.base_config().data.synthetic.languages) <= set(grammars.LANGUAGES)


# Allowed letter ranges per script (punctuation, digits and spaces are free).
_SCRIPT_RANGES = {
    "Latin": [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x17F)],
    "Cyrillic": [(0x400, 0x4FF)],
    "Japanese": [(0x3040, 0x309F), (0x30A0, 0x30FF), (0x4E00, 0x9FFF)],
    "Devanagari": [(0x900, 0x97F)],
    "Ethiopic": [(0x1200, 0x137F)],
}


@pytest.mark.parametrize("lang", grammars.LANGUAGES)
def test_captions_are_in_the_language_script(lang):
  ranges = _SCRIPT_RANGES[grammars.SCRIPTS[lang]]
  for d in _random_descriptions(150, seed=1):
    for text in grammars.all_captions(d, lang):
      letters = [ch for ch in text if unicodedata.category(ch)[0] in "LM"]  # Letters and vowel signs.
      assert letters, text
      bad = [ch for ch in letters if not any(lo <= ord(ch) <= hi for lo, hi in ranges)]
      assert not bad, (lang, text, bad)
      if lang == "ja":
        assert " " not in text, text
      if lang == "en":
        assert text.isascii(), text


def test_a_caption_names_exactly_one_description():
  """Across many scenes no caption (any paraphrase) is shared by two descriptions."""
  descriptions = set(_random_descriptions(1500, seed=2)) | set(_random_descriptions(300, seed=3, heldout=True))
  for lang in grammars.LANGUAGES:
    owner = {}
    for d in descriptions:
      for text in grammars.all_captions(d, lang):
        assert owner.setdefault(text, d) == d, (lang, text, d, owner[text])


def test_canonical_description_is_unique_per_scene():
  a, b, c = O("circle", "red", "small"), O("square", "blue", "large"), O("star", "green", "small")
  assert scenes.canonical(b, [(a, "left")]) == scenes.canonical(a, [(b, "right")])
  assert scenes.canonical(b, [(a, "below")]) == scenes.canonical(a, [(b, "above")])
  assert scenes.canonical(b, [(a, "left"), (c, "above")]) == scenes.canonical(b, [(c, "above"), (a, "left")])
  assert scenes.canonical(b, [(a, "left")]) != scenes.canonical(b, [(a, "right")])
  with pytest.raises(ValueError, match="share a relation"):
    scenes.canonical(b, [(a, "left"), (c, "left")])


_SQUARE_BLUE_L = O("square", "blue", "large")
_CIRCLE_RED_S = O("circle", "red", "small")
_HEART_WHITE_L = O("heart", "white", "large")
_STAR_PURPLE_S = O("star", "purple", "small")
_STAR_GREEN_S = O("star", "green", "small")

# (figure, relation, anchor) -> exact captions that must be among the paraphrases.
_HAND_WRITTEN = [
    ((_CIRCLE_RED_S, "left", _SQUARE_BLUE_L), {
        "en": ["a small red circle to the left of a large blue square",
               "A large blue square is to the right of a small red circle."],
        "de": ["ein kleiner roter Kreis links von einem großen blauen Quadrat",
               "Rechts von einem kleinen roten Kreis befindet sich ein großes blaues Quadrat."],
        "fr": ["un petit cercle rouge à gauche d'un grand carré bleu",
               "Il y a un grand carré bleu à droite d'un petit cercle rouge."],
        "cs": ["Vlevo od velkého modrého čtverce je malý červený kruh.",
               "velký modrý čtverec vpravo od malého červeného kruhu"],
        "ru": ["Маленький красный круг находится слева от большого синего квадрата.",
               "большой синий квадрат справа от маленького красного круга"],
        "ja": ["大きい青い四角の左に小さい赤い丸があります。", "小さい赤い丸の右にある大きい青い四角"],
        "hi": ["बड़े नीले वर्ग के बाईं ओर छोटा लाल वृत्त", "छोटे लाल वृत्त के दाईं ओर एक बड़ा नीला वर्ग है।"],
        "sw": ["Mduara mdogo mwekundu uko kushoto kwa mraba mkubwa wa buluu.",
               "Kuna mraba mkubwa wa buluu kulia kwa mduara mdogo mwekundu."],
        "am": ["ከትልቅ ሰማያዊ ካሬ በስተግራ ትንሽ ቀይ ክብ አለ።", "ከትንሽ ቀይ ክብ በስተቀኝ ትልቅ ሰማያዊ ካሬ"],
    }),
    # Feminine / neuter nouns, other cases, Swahili class 9, Hindi oblique -e.
    ((_STAR_PURPLE_S, "above", _HEART_WHITE_L), {
        "en": ["a large white heart below a small purple star"],
        "de": ["Über einem großen weißen Herzen befindet sich ein kleiner violetter Stern.",
               "ein großes weißes Herz unter einem kleinen violetten Stern"],
        "fr": ["une petite étoile violette au-dessus d'un grand cœur blanc",
               "Un grand cœur blanc se trouve en dessous d'une petite étoile violette."],
        "cs": ["malá fialová hvězda nad velkým bílým srdcem", "Pod malou fialovou hvězdou je velké bílé srdce."],
        "ru": ["Над большим белым сердцем находится маленькая фиолетовая звезда.",
               "большое белое сердце под маленькой фиолетовой звездой"],
        "ja": ["小さい紫の星が大きい白いハートの上にあります。"],
        "hi": ["छोटे बैंगनी तारे के नीचे बड़ा सफ़ेद दिल", "छोटा बैंगनी तारा बड़े सफ़ेद दिल के ऊपर है।"],
        "sw": ["Nyota ndogo ya zambarau iko juu ya moyo mkubwa mweupe.",
               "moyo mkubwa mweupe chini ya nyota ndogo ya zambarau"],
        "am": ["ከትልቅ ነጭ ልብ በላይ ትንሽ ሐምራዊ ኮከብ አለ።"],
    }),
]


@pytest.mark.parametrize("case", range(len(_HAND_WRITTEN)))
def test_hand_written_captions(case):
  (fig, rel, anchor), expected = _HAND_WRITTEN[case]
  d = scenes.canonical(anchor, [(fig, rel)])
  assert set(expected) == set(grammars.LANGUAGES)
  for lang, texts in expected.items():
    options = grammars.all_captions(d, lang)
    for text in texts:
      assert text in options, (lang, text, options)


def test_hand_written_one_and_three_object_captions():
  one = scenes.Description((O("cross", "orange", "large"),), ())
  assert grammars.all_captions(one, "de") == ["ein großes orangefarbenes Kreuz",
                                              "Zu sehen ist ein großes orangefarbenes Kreuz."]
  assert grammars.all_captions(one, "fr")[0] == "une grande croix orange"
  assert grammars.all_captions(one, "sw")[0] == "msalaba mkubwa wa rangi ya machungwa"
  three = scenes.canonical(_SQUARE_BLUE_L, [(_CIRCLE_RED_S, "left"), (_STAR_GREEN_S, "above")])
  expected = {
      "en": "a small red circle to the left of a large blue square, and a small green star above the large blue square",
      "de": "ein kleiner roter Kreis links von einem großen blauen Quadrat und ein kleiner grüner Stern "
            "über dem großen blauen Quadrat",
      "fr": "Il y a une petite étoile verte au-dessus d'un grand carré bleu et un petit cercle rouge "
            "à gauche du grand carré bleu.",
      "cs": "malý červený kruh vlevo od velkého modrého čtverce a malá zelená hvězda nad velkým modrým čtvercem",
      "ru": "Маленький красный круг находится слева от большого синего квадрата, и маленькая зелёная звезда "
            "находится над большим синим квадратом.",
      "ja": "大きい青い四角の左に小さい赤い丸があり、大きい青い四角の上に小さい緑の星があります。",
      "hi": "बड़े नीले वर्ग के बाईं ओर एक छोटा लाल वृत्त है और बड़े नीले वर्ग के ऊपर एक छोटा हरा तारा है।",
      "sw": "mduara mdogo mwekundu kushoto kwa mraba mkubwa wa buluu na nyota ndogo ya kijani "
            "juu ya mraba mkubwa wa buluu",
      "am": "ከትልቅ ሰማያዊ ካሬ በስተግራ ትንሽ ቀይ ክብ አለ፤ ከትልቅ ሰማያዊ ካሬ በላይ ደግሞ ትንሽ አረንጓዴ ኮከብ አለ።",
  }
  for lang, text in expected.items():
    assert text in grammars.all_captions(three, lang), (lang, grammars.all_captions(three, lang))


# ---- Determinism, splits, counts -------------------------------------------

def test_same_seed_same_bytes_other_seed_other_data():
  a, b, other = _settings(size=24), _settings(size=24), _settings(size=24, seed=1)
  for split in S.SPLITS:
    for i in (0, 5, 17):
      da, ia, ca, la = S.image_text_example(a, split, i)
      db, ib, cb, lb = S.image_text_example(b, split, i)
      assert da == db and ca == cb and la == lb and ia.tobytes() == ib.tobytes()
      assert S.text_pair_example(a, split, i) == S.text_pair_example(b, split, i)
  differ = [S.image_text_example(a, "train", i)[1].tobytes() != S.image_text_example(other, "train", i)[1].tobytes()
            for i in range(10)]
  assert all(differ)
  assert S.eval_descriptions(a) != S.eval_descriptions(other)


def test_train_never_sees_heldout_descriptions():
  st = _settings(size=8, default_pairs=500)
  train = [S.image_text_example(st, "train", i)[0] for i in range(1500)]
  train += [S.text_pair_example(st, "train", i)[0] for i in range(1500)]
  heldout = set(S.eval_descriptions(st))
  assert not heldout & set(train)
  assert not any(scenes.is_heldout(d, st.heldout_fraction) for d in train)
  assert all(scenes.is_heldout(d, st.heldout_fraction) for d in heldout)
  # The split is real where it matters: one-object scenes are few (96), train
  # covers nearly all of its own, and none of the held-out ones.
  singles = [scenes.Description((O(s, c, z),), ())
             for s in scenes.SHAPES for c in scenes.COLOURS for z in scenes.SIZES]
  held = {d for d in singles if scenes.is_heldout(d, st.heldout_fraction)}
  assert 3 <= len(held) <= 25
  seen = {d for d in train if len(d.objects) == 1}
  assert len(seen) >= 0.9 * (len(singles) - len(held)) and not seen & held


def test_eval_descriptions_are_unique_and_complete():
  cfg = _config(size=16, eval_captions_per_scene=2)
  data = S.build_eval_data(cfg)
  n = cfg.data.synthetic.eval_scenes
  assert len(set(data.descriptions)) == len(data.descriptions) == n
  assert data.images.shape == (n, 16, 16, 3) and data.images.dtype == np.uint8
  assert set(data.languages) == set(cfg.data.synthetic.languages)
  for lang, ev in data.languages.items():
    assert len(ev.captions) == 2 * n and ev.text_to_image.dtype == np.int32
    np.testing.assert_array_equal(np.bincount(ev.text_to_image), np.full(n, 2))
    for text, k in zip(ev.captions, ev.text_to_image):
      assert text in grammars.all_captions(data.descriptions[k], lang)
  assert sorted(data.translations) == sorted(f"en-{l}" for l in cfg.data.synthetic.languages if l != "en")
  for pairs in data.translations.values():
    assert len(pairs.left) == len(pairs.right) == n
    for k, (left, right) in enumerate(zip(pairs.left, pairs.right)):
      assert left in grammars.all_captions(data.descriptions[k], pairs.left_lang)
      assert right in grammars.all_captions(data.descriptions[k], pairs.right_lang)


def _take(ds):
  return [{k: (v.tobytes() if isinstance(v, np.ndarray) else v) for k, v in x.items()} for x in ds.as_numpy_iterator()]


def test_source_counts_follow_the_config():
  cfg = _config(size=8, languages=["en", "de", "sw", "am"], default_pairs=5,
                pairs_per_language={"sw": 7, "de": 0}, translation_pairs=4,
                translation_pairs_per_pair={"en-sw": 9, "en-am": 0})
  langs = collections.Counter(x["lang"].decode() for x in _take(S.image_text_source(cfg, "train", 0, 1)))
  assert langs == {"en": 5, "sw": 7, "am": 5}
  twice = collections.Counter(x["lang"].decode() for x in _take(S.image_text_source(cfg, "train", 0, 1, num_epochs=2)))
  assert twice == {"en": 10, "sw": 14, "am": 10}
  endless = S.image_text_source(cfg, "train", 0, 1, num_epochs=None).take(3 * 17)
  assert collections.Counter(x["lang"].decode() for x in _take(endless)) == {"en": 15, "sw": 21, "am": 15}
  pairs = collections.Counter((x["left_lang"].decode(), x["right_lang"].decode())
                              for x in _take(S.text_pair_source(cfg, "train", 0, 1)))
  assert pairs == {("en", "de"): 4, ("en", "sw"): 9}
  cfg.data.synthetic.translation_pair_list = ["de-sw"]
  cfg.data.synthetic.translation_pairs_per_pair = {}
  pairs = collections.Counter((x["left_lang"].decode(), x["right_lang"].decode())
                              for x in _take(S.text_pair_source(cfg, "train", 0, 1)))
  assert pairs == {("de", "sw"): 4}



def test_text_only_source_is_the_same_records_without_images():
  # The vocab reads captions only; the images are drawn (the captions' draws follow theirs)
  # but not painted. Records at start_index 5, endless, as the pipeline opens them.
  cfg = _config(size=16, languages=["en", "de", "sw"], default_pairs=20)
  full = _take(S.image_text_source(cfg, "train", 0, 1, 5, num_epochs=None).take(70))
  text = _take(S.image_text_source(cfg, "train", 0, 1, 5, num_epochs=None, with_images=False).take(70))
  assert all(set(r) == {"caption", "lang"} for r in text)
  assert text == [{k: r[k] for k in ("caption", "lang")} for r in full]
  assert len({r["caption"] for r in text}) > 40  # Varied, not one repeated caption.
  opened = sources_lib.synthetic_image_text(dict(name="synthetic"), "train", config=cfg)
  assert _take(opened.open_text_at(0).take(70)) == _take(
      S.image_text_source(cfg, "train", 0, 1, num_epochs=None, with_images=False).take(70))

def test_translation_pairs_describe_one_scene():
  cfg = _config(size=8, translation_pairs=30)
  st = settings_lib.Settings.from_config(cfg)
  rows = _take(S.text_pair_source(cfg, "train", 0, 1))
  assert len(rows) == 30 * (len(st.languages) - 1)
  for i, row in enumerate(rows[:60]):
    d, left, right, a, b = S.text_pair_example(st, "train", i)
    assert (row["left"].decode(), row["right"].decode(), row["left_lang"].decode(), row["right_lang"].decode()) \
        == (left, right, a, b)
    assert left in grammars.all_captions(d, a) and right in grammars.all_captions(d, b)


def test_comparable_pairs_describe_parts_of_one_scene_independently():
  translations = _settings(size=8, translation_pairs=300)
  comparable = _settings(size=8, translation_pairs=300, caption_pairs="comparable")
  n, differ, partial = 600, 0, 0
  for i in range(n):
    d, left, right, a, b = S.text_pair_example(comparable, "train", i)
    assert d == S.text_pair_example(translations, "train", i)[0]  # Same scenes, other captions.
    sides = []
    for text, lang in ((left, a), (right, b)):
      # Each caption says the whole scene or one of its parts, never a held-out description.
      said = [v for v in scenes.views(d, comparable.heldout_fraction)
              if text in grammars.all_captions(v, lang)]
      assert len(said) == 1 and not scenes.is_heldout(said[0], comparable.heldout_fraction), (d, text)
      assert d.objects[0] in said[0].objects  # The anchor, always.
      sides.append(said[0])
    partial += sum(v != d for v in sides)
    differ += sides[0] != sides[1]
  # Views drawn independently per side: two-object scenes (40%) have two, three-object ones (40%)
  # three, so the sides differ in 0.4 / 2 + 0.4 * 2 / 3 = 47% of pairs, with 0.93 parts per pair.
  assert 0.4 * n < differ < 0.55 * n and 0.8 * n < partial < 1.06 * n, (differ, partial)
  # Parts of scenes: the anchor with one figure, or the anchor alone.
  d = scenes.Description((O("circle", "red", "small"), O("star", "blue", "large"), O("heart", "white", "small")),
                         ("left", "above"))
  assert set(scenes.views(d, 0.01)) <= {d, scenes.canonical(d.objects[0], [(d.objects[1], "left")]),
                                        scenes.canonical(d.objects[0], [(d.objects[2], "above")])}
  alone = scenes.Description((d.objects[0],), ())
  assert scenes.views(alone, 0.01) == [alone]
  two = scenes.canonical(d.objects[0], [(d.objects[1], "left")])
  assert scenes.views(two, 0.01) in ([two, scenes.Description(two.objects[:1], ())], [two])
  # The eval pairs stay aligned: one whole description on both sides.
  for i in range(20):
    d, left, right, a, b = S.text_pair_example(comparable, "eval", i)
    assert left in grammars.all_captions(d, a) and right in grammars.all_captions(d, b)


def test_sharding_is_disjoint_and_covers_everything_and_resumes():
  cfg = _config(size=8, languages=["en", "ru", "ja"], default_pairs=7, translation_pairs=5)  # 21 and 10: odd.
  for source in (S.image_text_source, S.text_pair_source):
    whole = _take(source(cfg, "train", 0, 1))
    hosts = [_take(source(cfg, "train", p, 2)) for p in range(2)]
    assert len(hosts[0]) + len(hosts[1]) == len(whole)
    assert hosts[0] == whole[0::2] and hosts[1] == whole[1::2]  # Host p reads p, p+2, ...
    keys = lambda rows: {tuple(sorted(r.items())) for r in rows}
    assert not keys(hosts[0]) & keys(hosts[1])
    # A host that consumed k elements resumes at start_index = k * process_count.
    assert _take(source(cfg, "train", 1, 2, start_index=3 * 2)) == hosts[1][3:]
    assert _take(source(cfg, "train", 0, 1, start_index=4)) == whole[4:]


def test_source_element_types_and_eval_split():
  cfg = _config(size=12, languages=["en", "hi"])
  ds = S.image_text_source(cfg, "eval", 0, 1)
  assert ds.element_spec["image"].shape.as_list() == [12, 12, 3]
  assert ds.element_spec["image"].dtype.name == "uint8"
  assert ds.element_spec["caption"].dtype.name == "string"
  rows = list(ds.as_numpy_iterator())
  data = S.build_eval_data(cfg)
  assert len(rows) == 2 * len(data.descriptions)
  for i, row in enumerate(rows):
    k, lang = divmod(i, 2)
    np.testing.assert_array_equal(row["image"], data.images[k])
    assert row["caption"].decode() == data.languages[row["lang"].decode()].captions[k]
  pairs = _take(S.text_pair_source(cfg, "eval", 0, 1))
  assert [r["right"].decode() for r in pairs] == data.translations["en-hi"].right


def test_languages_come_mixed_in_source_order():
  st = _settings(size=8, default_pairs=100)
  first = [S.image_text_example(st, "train", i)[3] for i in range(40)]
  assert len(set(first)) == len(st.languages)  # Not one language block after another.
  epoch0 = sorted(S.image_text_example(st, "train", i)[2] for i in range(800))
  epoch1 = sorted(S.image_text_example(st, "train", 800 + i)[2] for i in range(800))
  assert epoch0 == epoch1  # Same examples, another order.


def test_training_example_is_a_languages_own_record_of_the_mix():
  """training_example(lang, j) reads one language's pairs directly (mural_claim.py counts the
  scarce language's words with it): over an epoch the mix holds exactly those records."""
  st = _settings(size=8, languages=("en", "sw", "ja"), pairs_per_language={"sw": 7, "ja": 5},
                 default_pairs=9)
  record = lambda r: (r[0], r[2], r[3], r[1].tobytes())
  mix = sorted(record(S.image_text_example(st, "train", i)) for i in range(9 + 7 + 5))
  direct = sorted(record(S.training_example(st, lang, j)) for lang, n in zip(st.languages, (9, 7, 5))
                  for j in range(n))
  assert mix == direct
  assert S.training_example(st, "sw", 3, with_image=False)[1:] == (None,) + S.training_example(st, "sw", 3)[2:]


# ---- Pixels ------------------------------------------------------------------

def test_pixels_show_the_described_objects():
  size = 64
  large, small = [], []
  for seed, d in enumerate(_random_descriptions(120, seed=4)):
    image, centres, radii = rendering.render(d, size, np.random.default_rng(seed), with_layout=True)
    assert image.shape == (size, size, 3) and image.dtype == np.uint8
    for obj, (cx, cy), r in zip(d.objects, centres, radii):
      assert 0 <= cx - r and cx + r <= size and 0 <= cy - r and cy + r <= size
      pixel = image[int(cy), int(cx)].astype(int)
      jitter = rendering._COLOUR_JITTER
      assert np.abs(pixel - rendering.COLOUR_RGB[obj.colour]).max() <= jitter + 2, (obj, pixel)
      (large if obj.size == "large" else small).append(r)
    for k, rel in enumerate(d.relations, start=1):
      dx, dy = centres[k] - centres[0]
      along, across = {"left": (-dx, dy), "right": (dx, dy), "above": (-dy, dx), "below": (dy, dx)}[rel]
      assert along > 0 and abs(across) < 0.3 * along, (d, rel, dx, dy)
  assert min(large) > 1.3 * max(small)


# Shape areas in radius^2 units, from their geometry in synthetic_render._sdf.
_AREAS = {
    "circle": np.pi,
    "square": (2 * 0.82) ** 2,
    "triangle": 3 * np.sqrt(3) / 4 * 1.15**2,  # Equilateral, circumradius 1.15.
    "star": 5 * 1.15 * 0.48 * np.sin(np.pi / 5),  # 10 triangles (centre, tip, inner vertex).
    "cross": 2 * (2 * 0.68) - 0.68**2,  # Two 2 x 0.68 bars minus their overlap.
}


@pytest.mark.parametrize("shape", scenes.SHAPES)
def test_shape_coverage_matches_geometry(shape):
  """Same rng, two colours: the difference image is the object's antialiased coverage."""
  images = []
  for colour in ("red", "blue"):
    d = scenes.Description((O(shape, colour, "large"),), ())
    image, (centre,), (r,) = rendering.render(d, 64, np.random.default_rng(7), with_layout=True)
    images.append(image.astype(float))
  diff = np.subtract(rendering.COLOUR_RGB["red"], rendering.COLOUR_RGB["blue"])
  coverage = (images[0] - images[1]) @ diff / (diff @ diff)
  assert coverage.min() > -0.02 and coverage.max() < 1.02
  assert coverage[int(centre[1]), int(centre[0])] > 0.98
  area = coverage.sum() / r**2
  if shape == "heart":
    assert 2.0 < area < 3.2, area
  else:
    assert area == pytest.approx(_AREAS[shape], rel=0.04), (shape, area)


# ---- Config errors -----------------------------------------------------------

@pytest.mark.parametrize("field, value, match", [
    ("languages", ["en", "xx"], "data.synthetic.languages"),
    ("pairs_per_language", {"zz": 3}, "data.synthetic.pairs_per_language"),
    ("translation_pivot", "xx", "data.synthetic.translation_pivot"),
    ("translation_pair_list", ["en-en"], "data.synthetic.translation_pair_list"),
    ("translation_pairs_per_pair", {"de-fr": 1}, "data.synthetic.translation_pairs_per_pair"),
    ("heldout_fraction", 0.0, "data.synthetic.heldout_fraction"),
    ("heldout_fraction", 0.9, "data.synthetic.heldout_fraction"),
    ("render_size", 4, "data.synthetic.render_size"),
    ("eval_scenes", 0, "data.synthetic.eval_scenes"),
    ("caption_pairs", "paraphrases", "data.synthetic.caption_pairs"),
])
def test_bad_config_names_the_field(field, value, match):
  cfg = _config()
  cfg.data.synthetic[field] = value
  with pytest.raises(config_lib.ConfigError, match=match):
    settings_lib.Settings.from_config(cfg)
