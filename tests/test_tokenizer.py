"""Wordpiece tokenizer on real multilingual captions: ids, mask, round trip, edge cases."""

import csv
import re
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from mural.data import tokenizer as tok_lib

from conftest import TEST_DATA

# Written for these tests (no such captions in the data): Russian, Hindi, Japanese.
HANDWRITTEN = {
    "ru": ["Маленькая девочка в розовом платье поднимается по лестнице.",
           "Две собаки играют на снегу.",
           "Мужчина в синей куртке едет на велосипеде по улице."],
    "hi": ["गुलाबी पोशाक में एक छोटी लड़की सीढ़ियाँ चढ़ रही है।",
           "दो कुत्ते बर्फ़ में खेल रहे हैं।",
           "नीली जैकेट पहने एक आदमी सड़क पर साइकिल चला रहा है।"],
    "ja": ["ピンクのドレスを着た小さな女の子が階段を上っています。",
           "二匹の犬が雪の中で遊んでいます。",
           "青いジャケットを着た男性が通りで自転車に乗っています。"],
}
# Used when the Flickr8k captions are absent, so the data-free tests still run.
FALLBACK = ["A black dog runs through the snow.", "Malá dívka leze do dřevěného domu.",
            "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.", "A byt, nebo být?"]
REAL_LANGS = ("en", "zh", "ar", "de", "fr", "cs")
VOCAB_SIZE = 3000


def _real_captions():
  """First 400 captions per language of flickr8k_1k/captions.tsv, or None when absent."""
  path = TEST_DATA / "flickr8k_1k" / "captions.tsv"
  if not path.exists():
    return None
  out = {lang: [] for lang in REAL_LANGS}
  with open(path, encoding="utf-8") as f:
    for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
      if len(out[row["lang"]]) < 400:
        out[row["lang"]].append(row["caption"])
  return out


@pytest.fixture(scope="module")
def corpus():
  real = _real_captions()
  texts = [s for ss in HANDWRITTEN.values() for s in ss] * 3 + FALLBACK * 3
  if real:
    texts += [s for ss in real.values() for s in ss]
  return dict(real=real, texts=texts)


@pytest.fixture(scope="module")
def vocab_path(corpus, tmp_path_factory):
  path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
  tok_lib.build_vocab(corpus["texts"], VOCAB_SIZE, path)
  return path


@pytest.fixture(scope="module")
def tok(vocab_path):
  return tok_lib.Tokenizer(vocab_path, max_len=96)


def _reference_words(text):
  """Independent of TF Text: NFKC + casefold, split on spaces/punctuation, CJK ideographs alone."""
  text = unicodedata.normalize("NFKC", text.casefold())
  words, cur = [], ""
  for ch in text:
    cjk = 0x4E00 <= ord(ch) <= 0x9FFF or 0x3400 <= ord(ch) <= 0x4DBF or 0xF900 <= ord(ch) <= 0xFAFF
    punct = unicodedata.category(ch).startswith("P") or (ch.isascii() and not ch.isalnum() and not ch.isspace())
    if ch.isspace() or punct or cjk:
      if cur:
        words.append(cur)
      cur = ""
      if not ch.isspace():
        words.append(ch)
    else:
      cur += ch
  if cur:
    words.append(cur)
  return words


def _sentences(corpus, lang):
  if lang in HANDWRITTEN:
    return HANDWRITTEN[lang]
  if not corpus["real"]:
    pytest.skip("Flickr8k captions not available (MURAL_TEST_DATA/flickr8k_1k)")
  return corpus["real"][lang][:3]


def _ids(tok, texts):
  ids, mask = tok.tokenize(tf.constant(texts))
  return ids.numpy(), mask.numpy()


def test_vocab_file_reserved_tokens_and_size(vocab_path, tok):
  vocab = tok_lib.load_vocab(vocab_path)
  assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert (tok_lib.PAD_ID, tok_lib.UNK_ID, tok_lib.CLS_ID, tok_lib.SEP_ID, tok_lib.MASK_ID) == (0, 1, 2, 3, 4)
  assert tok.vocab_size == len(vocab) == len(set(vocab))
  assert tok.vocab_size <= VOCAB_SIZE
  with open(vocab_path, encoding="utf-8") as f:
    assert f.read().splitlines() == vocab


@pytest.mark.parametrize("lang", REAL_LANGS + ("ru", "hi", "ja"))
def test_round_trip_recovers_the_words(corpus, tok, lang):
  sentences = _sentences(corpus, lang)
  ids, mask = _ids(tok, sentences)
  assert not np.any(ids == tok_lib.UNK_ID), f"{lang}: unknown pieces in {sentences}"
  assert np.all(mask.sum(1) < tok.max_len), "raise max_len: a test sentence was truncated"
  for got, text in zip(tok.detokenize(ids, mask), sentences):
    assert got.split(" ") == _reference_words(text), (lang, text)


def test_script_specific_tokenization(corpus, tok):
  # CJK ideographs are single words; kana runs are not split per character.
  words = tok.detokenize(*_ids(tok, ["小さな女の子"]))[0].split(" ")
  assert words == ["小", "さな", "女", "の", "子"]
  # Devanagari vowel signs / nukta survive (accent stripping would delete them).
  assert "लड़की" in tok.detokenize(*_ids(tok, [HANDWRITTEN["hi"][0]]))[0].split(" ")
  # Arabic and Cyrillic words come back whole.
  assert tok.detokenize(*_ids(tok, ["Две собаки"]))[0] == "две собаки"


def test_normalisation_folds_case_and_width_but_keeps_accents(tok):
  ids, _ = _ids(tok, ["Malá dívka", "malá di\u0301vka", "MALÁ DÍVKA", "ｍａｌá dívka",  # NFC/NFD/case/width.
                      "byt", "být"])
  np.testing.assert_array_equal(ids[0], ids[1])
  np.testing.assert_array_equal(ids[0], ids[2])
  np.testing.assert_array_equal(ids[0], ids[3])
  assert not np.array_equal(ids[4], ids[5]), "Czech 'byt' and 'být' must stay different"
  assert tok.detokenize(ids[5:6])[0] == "být"


def test_unknown_character_is_one_unk_and_the_rest_still_tokenizes(tok):
  assert tok.token_to_id("\u2603") is None
  ids, mask = _ids(tok, ["a black dog \u2603 runs", "a black dog runs", "a black do\u2603g"])
  with_unk, without = ids[0][mask[0] == 1], ids[1][mask[1] == 1]
  assert np.sum(with_unk == tok_lib.UNK_ID) == 1
  np.testing.assert_array_equal(with_unk[with_unk != tok_lib.UNK_ID], without)
  # Inside a word only the character is unknown, not the whole word.
  inner = ids[2][mask[2] == 1]
  assert np.sum(inner == tok_lib.UNK_ID) == 1 and len(inner) > 5
  assert tok.detokenize(ids[2:3])[0].startswith("a black do")


def test_cls_sep_and_padding_positions(tok):
  texts = ["a dog", "", "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.", "二匹の犬"]
  ids, mask = _ids(tok, texts)
  assert ids.shape == mask.shape == (4, tok.max_len) and ids.dtype == mask.dtype == np.int32
  for row_ids, row_mask, text in zip(ids, mask, texts):
    n = int(row_mask.sum())
    np.testing.assert_array_equal(row_mask[:n], 1)
    np.testing.assert_array_equal(row_mask[n:], 0)
    assert row_ids[0] == tok_lib.CLS_ID and row_ids[n - 1] == tok_lib.SEP_ID
    np.testing.assert_array_equal(row_ids[n:], tok_lib.PAD_ID)
    specials = [tok_lib.PAD_ID, tok_lib.CLS_ID, tok_lib.SEP_ID, tok_lib.MASK_ID]
    assert not np.isin(row_ids[1:n - 1], specials).any()
    assert n - 2 == len(tok.wordpieces(tf.constant([text]))[0])
  assert mask[1].sum() == 2  # Empty text: [CLS] [SEP].


def test_truncation_keeps_sep_last(vocab_path):
  short = tok_lib.Tokenizer(vocab_path, max_len=8)
  text = "A little girl in a pink dress going into a wooden cabin."
  full = short.wordpieces(tf.constant([text]))[0].numpy()
  assert len(full) > 6
  ids, mask = _ids(short, [text, "a dog"])
  np.testing.assert_array_equal(mask[0], 1)
  assert ids[0, 0] == tok_lib.CLS_ID and ids[0, -1] == tok_lib.SEP_ID
  np.testing.assert_array_equal(ids[0, 1:-1], full[:6])
  # Exactly max_len - 2 pieces: no truncation, no padding.
  exact = tok_lib.Tokenizer(vocab_path, max_len=len(full) + 2)
  ids, mask = _ids(exact, [text])
  np.testing.assert_array_equal(ids[0, 1:-1], full)
  assert mask.sum() == len(full) + 2


def test_works_inside_tf_data_and_tf_function(tok):
  texts = ["a dog", "Malá dívka leze do domu.", "二匹の犬が雪の中で遊んでいます。"]
  eager_ids, eager_mask = _ids(tok, texts)
  per_elem = list(tf.data.Dataset.from_tensor_slices(texts).map(tok.tokenize).as_numpy_iterator())
  np.testing.assert_array_equal(np.stack([e[0] for e in per_elem]), eager_ids)
  batched_ds = tf.data.Dataset.from_tensor_slices(texts).batch(3).map(tok.tokenize)
  assert [s.shape.as_list() for s in batched_ds.element_spec] == [[None, tok.max_len]] * 2  # Static L.
  batched = next(batched_ds.as_numpy_iterator())
  np.testing.assert_array_equal(batched[0], eager_ids)
  np.testing.assert_array_equal(batched[1], eager_mask)
  fn_ids, _ = tf.function(tok.tokenize)(tf.constant(texts))
  np.testing.assert_array_equal(fn_ids.numpy(), eager_ids)


def test_build_from_dataset_equals_build_from_list(tmp_path):
  texts = FALLBACK * 5 + HANDWRITTEN["ru"] * 5
  v_list = tok_lib.build_vocab(texts, 200, str(tmp_path / "a.txt"))
  v_ds = tok_lib.build_vocab(tf.data.Dataset.from_tensor_slices(texts).batch(4), 200, str(tmp_path / "b.txt"))
  assert v_list == v_ds
  with pytest.raises(ValueError, match=r"texts\[1\] is a NoneType, not a string"):
    tok_lib.build_vocab(["a b", None], 200, str(tmp_path / "c.txt"))
  assert "##" + "ý" in v_list and "ý" in v_list  # Characters, also as continuation pieces.


def test_vocab_cap_drops_rarest_pieces_and_keeps_every_character(corpus, tmp_path):
  if not corpus["real"]:
    pytest.skip("Flickr8k captions not available (MURAL_TEST_DATA/flickr8k_1k)")
  texts = corpus["real"]["en"] + corpus["real"]["cs"]
  # On this corpus the learner returns ~1070 pieces for any target >= 800.
  uncapped = tok_lib.build_vocab(texts, 100_000, str(tmp_path / "u.txt"))
  assert len(uncapped) > 800
  capped = tok_lib.build_vocab(texts, 800, str(tmp_path / "c.txt"))
  assert len(capped) == 800
  is_char = lambda t: len(t.removeprefix("##")) == 1
  assert {t for t in uncapped if is_char(t)} <= set(capped)
  assert capped == [t for t in uncapped if t in set(capped)]  # Same order, ids of kept chars shift only.
  dropped = [i for i, t in enumerate(uncapped) if t not in set(capped)]
  kept_learned = [i for i, t in enumerate(uncapped) if t in set(capped) and not is_char(t) and i >= 5]
  assert min(dropped) > max(kept_learned)  # The learner lists pieces by falling count: the rarest go.
  texts = FALLBACK * 5 + HANDWRITTEN["ru"] * 5 + HANDWRITTEN["hi"] * 5
  with pytest.raises(ValueError, match="character pieces alone exceed"):
    tok_lib.build_vocab(texts, 150, str(tmp_path / "x.txt"))


def test_bad_vocab_files_are_clear_errors(tmp_path):
  missing = str(tmp_path / "nope.txt")
  with pytest.raises(ValueError, match=re.escape(missing)):
    tok_lib.Tokenizer(missing, 16)
  bad = tmp_path / "bad.txt"
  bad.write_text("[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\na\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"line 1 must be \[PAD\]"):
    tok_lib.Tokenizer(str(bad), 16)
  dup = tmp_path / "dup.txt"
  dup.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\na\n", encoding="utf-8")
  with pytest.raises(ValueError, match="duplicate"):
    tok_lib.Tokenizer(str(dup), 16)
  with pytest.raises(ValueError, match="max_len"):
    tok_lib.Tokenizer(str(tmp_path / "dup.txt"), 2)


def test_a_process_keeps_one_tokenizer_per_vocab_file_contents_and_length(tmp_path):
  from mural import config_lib  # pylint: disable=g-import-not-at-top
  from mural.data import vocab  # pylint: disable=g-import-not-at-top
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(tok_lib.RESERVED_TOKENS + ("red", "circle")) + "\n", encoding="utf-8")
  config = config_lib.base_config()
  config.data.vocab_path, config.model.text.max_len = str(path), 8
  first = vocab.tokenizer(config, (), str(tmp_path))
  assert vocab.tokenizer(config, (), str(tmp_path)) is first  # Its traced graph is reused.
  config.model.text.max_len = 6
  assert vocab.tokenizer(config, (), str(tmp_path)).max_len == 6
  path.write_text("\n".join(tok_lib.RESERVED_TOKENS + ("blue", "square", "red")) + "\n", encoding="utf-8")
  config.model.text.max_len = 8
  rewritten = vocab.tokenizer(config, (), str(tmp_path))  # Same path, new contents: read again.
  assert rewritten is not first and rewritten.vocab[-3:] == ["blue", "square", "red"]
  ids, mask = rewritten.tokenize(tf.constant(["red square"]))
  n = len(tok_lib.RESERVED_TOKENS)
  assert ids.numpy()[0, :4].tolist() == [tok_lib.CLS_ID, n + 2, n + 1, tok_lib.SEP_ID]
  assert mask.numpy()[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
