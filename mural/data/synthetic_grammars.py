"""Captions of a scene in nine languages, from one small hand-written grammar per language.

Each grammar has its language's own word order and agreement (gender, case, noun class) and a
few paraphrase templates. It renders every paraphrase of a scene: one(a), two(fig, rel, anchor)
and three(anchor, (f1, r1), (f2, r2)) return lists of strings; `all_captions` also says a
two-object scene from either object. `LANGUAGES` (the codes config.data.synthetic.languages may
name) and `SCRIPTS` come from the grammar table. NumPy only.
"""

import numpy as np

from mural.data.synthetic_scenes import Description
from mural.data.synthetic_scenes import INVERSE


def _cap(s: str) -> str:
  return s[:1].upper() + s[1:]


class _English:
  code, script = "en", "Latin"
  rel = {"left": "to the left of", "right": "to the right of", "above": "above", "below": "below"}

  def phrase(self, o, art="a"):
    return f"{art} {o.size} {o.colour} {o.shape}"

  def one(self, a):
    return [self.phrase(a), f"There is {self.phrase(a)}."]

  def two(self, f, r, g):
    fig, rp = self.phrase(f), f"{self.rel[r]} {self.phrase(g)}"
    return [f"{fig} {rp}", f"There is {fig} {rp}.", f"{_cap(fig)} is {rp}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    p1 = f"{self.phrase(f1)} {self.rel[r1]} {self.phrase(g)}"
    p2 = f"{self.phrase(f2)} {self.rel[r2]} {self.phrase(g, 'the')}"
    return [f"{p1}, and {p2}", f"There is {p1}, and {p2}."]


class _German:
  """Mixed declension after ein (nominative), -en after einem/einer/dem."""
  code, script = "de", "Latin"
  noun = {"circle": ("Kreis", "m", "Kreis"), "square": ("Quadrat", "n", "Quadrat"),
          "triangle": ("Dreieck", "n", "Dreieck"), "star": ("Stern", "m", "Stern"),
          "heart": ("Herz", "n", "Herzen"), "cross": ("Kreuz", "n", "Kreuz")}  # (nom, gender, dat)
  adj = {"small": "klein", "large": "groß", "red": "rot", "green": "grün", "blue": "blau",
         "yellow": "gelb", "white": "weiß", "black": "schwarz", "purple": "violett",
         "orange": "orangefarben"}
  rel = {"left": "links von", "right": "rechts von", "above": "über", "below": "unter"}

  def nom(self, o):
    n, gender, _ = self.noun[o.shape]
    art, end = {"m": ("ein", "er"), "n": ("ein", "es"), "f": ("eine", "e")}[gender]
    return f"{art} {self.adj[o.size]}{end} {self.adj[o.colour]}{end} {n}"

  def relp(self, r, o, definite=False):
    _, gender, dat = self.noun[o.shape]
    art = ({"m": "dem", "n": "dem", "f": "der"} if definite else
           {"m": "einem", "n": "einem", "f": "einer"})[gender]
    prep = self.rel[r]
    if prep.endswith(" von") and art == "dem":
      prep, art = prep[:-4], "vom"  # von dem -> vom
    return f"{prep} {art} {self.adj[o.size]}en {self.adj[o.colour]}en {dat}"

  def one(self, a):
    return [self.nom(a), f"Zu sehen ist {self.nom(a)}."]

  def two(self, f, r, g):
    fig, rp = self.nom(f), self.relp(r, g)
    return [f"{fig} {rp}", f"{_cap(fig)} befindet sich {rp}.", f"{_cap(rp)} befindet sich {fig}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    p1, p2 = self.relp(r1, g), self.relp(r2, g, definite=True)
    return [f"{self.nom(f1)} {p1} und {self.nom(f2)} {p2}",
            f"{_cap(self.nom(f1))} befindet sich {p1}, und {self.nom(f2)} befindet sich {p2}."]


class _French:
  """Size before the noun, colour after, both agreeing in gender."""
  code, script = "fr", "Latin"
  noun = {"circle": ("cercle", "m"), "square": ("carré", "m"), "triangle": ("triangle", "m"),
          "star": ("étoile", "f"), "heart": ("cœur", "m"), "cross": ("croix", "f")}
  adj = {"small": ("petit", "petite"), "large": ("grand", "grande"), "red": ("rouge", "rouge"),
         "green": ("vert", "verte"), "blue": ("bleu", "bleue"), "yellow": ("jaune", "jaune"),
         "white": ("blanc", "blanche"), "black": ("noir", "noire"), "purple": ("violet", "violette"),
         "orange": ("orange", "orange")}
  rel = {"left": "à gauche", "right": "à droite", "above": "au-dessus", "below": "en dessous"}

  def phrase(self, o, det=None):
    n, gender = self.noun[o.shape]
    g = 0 if gender == "m" else 1
    det = det[g] if det else ("un", "une")[g]
    return f"{det} {self.adj[o.size][g]} {n} {self.adj[o.colour][g]}"

  def relp(self, r, o, definite=False):  # Size (p-, g-) always follows: no elision.
    return f"{self.rel[r]} " + self.phrase(o, ("du", "de la") if definite else ("d'un", "d'une"))

  def one(self, a):
    return [self.phrase(a), f"Il y a {self.phrase(a)}."]

  def two(self, f, r, g):
    fig, rp = self.phrase(f), self.relp(r, g)
    return [f"{fig} {rp}", f"Il y a {fig} {rp}.", f"{_cap(fig)} se trouve {rp}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    p = f"{self.phrase(f1)} {self.relp(r1, g)} et {self.phrase(f2)} {self.relp(r2, g, definite=True)}"
    return [p, f"Il y a {p}."]


class _Czech:
  """Hard adjectives; 'vlevo/vpravo od' + genitive, 'nad/pod' + instrumental."""
  code, script = "cs", "Latin"
  noun = {"circle": ("kruh", "m", "kruhu", "kruhem"), "square": ("čtverec", "m", "čtverce", "čtvercem"),
          "triangle": ("trojúhelník", "m", "trojúhelníku", "trojúhelníkem"),
          "star": ("hvězda", "f", "hvězdy", "hvězdou"), "heart": ("srdce", "n", "srdce", "srdcem"),
          "cross": ("kříž", "m", "kříže", "křížem")}  # (nom, gender, gen, ins)
  stem = {"small": "mal", "large": "velk", "red": "červen", "green": "zelen", "blue": "modr",
          "yellow": "žlut", "white": "bíl", "black": "čern", "purple": "fialov", "orange": "oranžov"}
  ending = {"nom": {"m": "ý", "f": "á", "n": "é"}, "gen": {"m": "ého", "f": "é", "n": "ého"},
            "ins": {"m": "ým", "f": "ou", "n": "ým"}}
  rel = {"left": ("vlevo od", "gen"), "right": ("vpravo od", "gen"), "above": ("nad", "ins"),
         "below": ("pod", "ins")}

  def phrase(self, o, case="nom"):
    nom, gender, gen, ins = self.noun[o.shape]
    e = self.ending[case][gender]
    return f"{self.stem[o.size]}{e} {self.stem[o.colour]}{e} {dict(nom=nom, gen=gen, ins=ins)[case]}"

  def relp(self, r, o):
    prep, case = self.rel[r]
    return f"{prep} {self.phrase(o, case)}"

  def one(self, a):
    return [self.phrase(a), f"Na obrázku je {self.phrase(a)}."]

  def two(self, f, r, g):
    fig, rp = self.phrase(f), self.relp(r, g)
    return [f"{fig} {rp}", f"{_cap(fig)} je {rp}.", f"{_cap(rp)} je {fig}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    a, b = self.phrase(f1), self.phrase(f2)
    p1, p2 = self.relp(r1, g), self.relp(r2, g)
    return [f"{a} {p1} a {b} {p2}", f"{_cap(a)} je {p1} a {b} je {p2}."]


def _ru_hard(stem: str) -> tuple:
  """Hard-stem adjective: nom m/f/n, gen m/n, gen f, ins m/n, ins f."""
  return (stem + "ый", stem + "ая", stem + "ое", stem + "ого", stem + "ой", stem + "ым", stem + "ой")


class _Russian:
  """'слева/справа от' + genitive, 'над/под' + instrumental."""
  code, script = "ru", "Cyrillic"
  noun = {"circle": ("круг", "m", "круга", "кругом"), "square": ("квадрат", "m", "квадрата", "квадратом"),
          "triangle": ("треугольник", "m", "треугольника", "треугольником"),
          "star": ("звезда", "f", "звезды", "звездой"), "heart": ("сердце", "n", "сердца", "сердцем"),
          "cross": ("крест", "m", "креста", "крестом")}  # (nom, gender, gen, ins)

  adj = {"small": ("маленький", "маленькая", "маленькое", "маленького", "маленькой", "маленьким", "маленькой"),
         "large": ("большой", "большая", "большое", "большого", "большой", "большим", "большой"),
         "blue": ("синий", "синяя", "синее", "синего", "синей", "синим", "синей")}
  adj.update({k: _ru_hard(stem) for k, stem in (
      ("red", "красн"), ("green", "зелён"), ("yellow", "жёлт"), ("white", "бел"), ("black", "чёрн"),
      ("purple", "фиолетов"), ("orange", "оранжев"))})
  rel = {"left": ("слева от", "gen"), "right": ("справа от", "gen"), "above": ("над", "ins"),
         "below": ("под", "ins")}

  def phrase(self, o, case="nom"):
    nom, gender, gen, ins = self.noun[o.shape]
    slot = {("nom", "m"): 0, ("nom", "f"): 1, ("nom", "n"): 2, ("gen", "m"): 3, ("gen", "n"): 3,
            ("gen", "f"): 4, ("ins", "m"): 5, ("ins", "n"): 5, ("ins", "f"): 6}[case, gender]
    return f"{self.adj[o.size][slot]} {self.adj[o.colour][slot]} {dict(nom=nom, gen=gen, ins=ins)[case]}"

  def relp(self, r, o):
    prep, case = self.rel[r]
    return f"{prep} {self.phrase(o, case)}"

  def one(self, a):
    return [self.phrase(a), f"На картинке {self.phrase(a)}."]

  def two(self, f, r, g):
    fig, rp = self.phrase(f), self.relp(r, g)
    return [f"{fig} {rp}", f"{_cap(fig)} находится {rp}.", f"{_cap(rp)} находится {fig}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    a, b = self.phrase(f1), self.phrase(f2)
    p1, p2 = self.relp(r1, g), self.relp(r2, g)
    return [f"{a} {p1} и {b} {p2}", f"{_cap(a)} находится {p1}, и {b} находится {p2}."]


class _Japanese:
  """SOV, no spaces: '<anchor>の左に<figure>があります'."""
  code, script = "ja", "Japanese"
  noun = {"circle": "丸", "square": "四角", "triangle": "三角", "star": "星", "heart": "ハート", "cross": "十字"}
  adj = {"small": "小さい", "large": "大きい", "red": "赤い", "green": "緑の", "blue": "青い",
         "yellow": "黄色い", "white": "白い", "black": "黒い", "purple": "紫の", "orange": "オレンジ色の"}
  rel = {"left": "左", "right": "右", "above": "上", "below": "下"}

  def phrase(self, o):
    return f"{self.adj[o.size]}{self.adj[o.colour]}{self.noun[o.shape]}"

  def one(self, a):
    return [self.phrase(a), f"{self.phrase(a)}があります。"]

  def two(self, f, r, g):
    fig, loc = self.phrase(f), f"{self.phrase(g)}の{self.rel[r]}"
    return [f"{loc}にある{fig}", f"{loc}に{fig}があります。", f"{fig}が{loc}にあります。"]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    a, b = self.phrase(f1), self.phrase(f2)
    l1, l2 = f"{self.phrase(g)}の{self.rel[r1]}", f"{self.phrase(g)}の{self.rel[r2]}"
    return [f"{l1}にある{a}と、{l2}にある{b}", f"{l1}に{a}があり、{l2}に{b}があります。"]


class _Hindi:
  """Postpositions; -ā adjectives and तारा take the oblique -e before them."""
  code, script = "hi", "Devanagari"
  noun = {"circle": ("वृत्त", "वृत्त"), "square": ("वर्ग", "वर्ग"), "triangle": ("त्रिभुज", "त्रिभुज"),
          "star": ("तारा", "तारे"), "heart": ("दिल", "दिल"), "cross": ("क्रॉस", "क्रॉस")}  # (direct, oblique); all masculine
  adj = {"small": ("छोटा", "छोटे"), "large": ("बड़ा", "बड़े"), "red": ("लाल", "लाल"), "green": ("हरा", "हरे"),
         "blue": ("नीला", "नीले"), "yellow": ("पीला", "पीले"), "white": ("सफ़ेद", "सफ़ेद"),
         "black": ("काला", "काले"), "purple": ("बैंगनी", "बैंगनी"), "orange": ("नारंगी", "नारंगी")}
  rel = {"left": "के बाईं ओर", "right": "के दाईं ओर", "above": "के ऊपर", "below": "के नीचे"}

  def phrase(self, o, oblique=False):
    k = int(oblique)
    return f"{self.adj[o.size][k]} {self.adj[o.colour][k]} {self.noun[o.shape][k]}"

  def loc(self, r, g):
    return f"{self.phrase(g, oblique=True)} {self.rel[r]}"

  def one(self, a):
    return [self.phrase(a), f"चित्र में एक {self.phrase(a)} है।"]

  def two(self, f, r, g):
    fig, loc = self.phrase(f), self.loc(r, g)
    return [f"{loc} {fig}", f"{loc} एक {fig} है।", f"{fig} {loc} है।"]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    a, b = self.phrase(f1), self.phrase(f2)
    l1, l2 = self.loc(r1, g), self.loc(r2, g)
    return [f"{l1} {a} और {l2} {b}", f"{l1} एक {a} है और {l2} एक {b} है।"]


class _Swahili:
  """Adjectives follow the noun and agree with its class (3: m-mi, 9: n)."""
  code, script = "sw", "Latin"
  noun = {"circle": ("mduara", 3), "square": ("mraba", 3), "triangle": ("pembetatu", 9),
          "star": ("nyota", 9), "heart": ("moyo", 3), "cross": ("msalaba", 3)}
  size = {"small": {3: "mdogo", 9: "ndogo"}, "large": {3: "mkubwa", 9: "kubwa"}}
  agreeing = {"red": {3: "mwekundu", 9: "nyekundu"}, "white": {3: "mweupe", 9: "nyeupe"},
              "black": {3: "mweusi", 9: "nyeusi"}}
  colour_noun = {"green": "kijani", "blue": "buluu", "yellow": "njano", "purple": "zambarau",
                 "orange": "rangi ya machungwa"}  # After the genitive: wa (3) / ya (9).
  copula = {3: "uko", 9: "iko"}
  rel = {"left": "kushoto kwa", "right": "kulia kwa", "above": "juu ya", "below": "chini ya"}

  def phrase(self, o):
    n, cls = self.noun[o.shape]
    colour = (self.agreeing[o.colour][cls] if o.colour in self.agreeing
              else f"{'wa' if cls == 3 else 'ya'} {self.colour_noun[o.colour]}")
    return f"{n} {self.size[o.size][cls]} {colour}"

  def one(self, a):
    return [self.phrase(a), f"Kuna {self.phrase(a)}."]

  def two(self, f, r, g):
    fig, rp = self.phrase(f), f"{self.rel[r]} {self.phrase(g)}"
    return [f"{fig} {rp}", f"Kuna {fig} {rp}.", f"{_cap(fig)} {self.copula[self.noun[f.shape][1]]} {rp}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    p1 = f"{self.phrase(f1)} {self.rel[r1]} {self.phrase(g)}"
    p2 = f"{self.phrase(f2)} {self.rel[r2]} {self.phrase(g)}"
    return [f"{p1} na {p2}", f"Kuna {p1}, na {p2}."]


class _Amharic:
  """Adjectives before the noun; 'ከ<anchor> በስተግራ' (circumposition), verb last."""
  code, script = "am", "Ethiopic"
  noun = {"circle": "ክብ", "square": "ካሬ", "triangle": "ሦስት ማዕዘን", "star": "ኮከብ", "heart": "ልብ",
          "cross": "መስቀል"}
  adj = {"small": "ትንሽ", "large": "ትልቅ", "red": "ቀይ", "green": "አረንጓዴ", "blue": "ሰማያዊ", "yellow": "ቢጫ",
         "white": "ነጭ", "black": "ጥቁር", "purple": "ሐምራዊ", "orange": "ብርቱካናማ"}
  rel = {"left": "በስተግራ", "right": "በስተቀኝ", "above": "በላይ", "below": "በታች"}

  def phrase(self, o):
    return f"{self.adj[o.size]} {self.adj[o.colour]} {self.noun[o.shape]}"

  def loc(self, r, g):
    return f"ከ{self.phrase(g)} {self.rel[r]}"  # ከ is a prefix of the phrase's first word.

  def one(self, a):
    return [self.phrase(a), f"{self.phrase(a)} አለ።"]

  def two(self, f, r, g):
    loc, fig = self.loc(r, g), self.phrase(f)
    return [f"{loc} {fig}", f"{loc} {fig} አለ።"]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    l1, l2 = self.loc(r1, g), self.loc(r2, g)
    a, b = self.phrase(f1), self.phrase(f2)
    return [f"{l1} {a} እና {l2} {b}", f"{l1} {a} አለ፤ {l2} ደግሞ {b} አለ።"]


_GRAMMARS = {g.code: g for g in (_English(), _German(), _French(), _Czech(), _Russian(), _Japanese(),
                                  _Hindi(), _Swahili(), _Amharic())}
LANGUAGES = tuple(_GRAMMARS)
SCRIPTS = {code: g.script for code, g in _GRAMMARS.items()}


def all_captions(description: Description, lang: str) -> list:
  """Every caption the grammar can give the scene in `lang` (paraphrases)."""
  g = _GRAMMARS[lang]
  objs, rels = description.objects, description.relations
  if len(objs) == 1:
    return g.one(objs[0])
  if len(objs) == 2:  # Said from either object.
    return g.two(objs[1], rels[0], objs[0]) + g.two(objs[0], INVERSE[rels[0]], objs[1])
  c1, c2 = (objs[1], rels[0]), (objs[2], rels[1])
  return g.three(objs[0], c1, c2) + g.three(objs[0], c2, c1)


def caption(description: Description, lang: str, rng: np.random.Generator) -> str:
  options = all_captions(description, lang)
  return options[int(rng.integers(len(options)))]
