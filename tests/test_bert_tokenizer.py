"""A public BERT vocabulary tokenizes as its own tokenizer does: mural's Tokenizer against
Hugging Face's `tokenizers` (BertWordPieceTokenizer: BERT's normaliser, pre-tokenizer and
wordpiece), cased and uncased, on a multilingual sample, with the vocabulary laid out as
multilingual BERT's is ([PAD], [unused*], then [UNK], [CLS], [SEP], [MASK])."""

import pytest
from tokenizers import BertWordPieceTokenizer

from mural.data import tokenizer as tok_lib

SAMPLE = [
    "Le café est très bon à Paris.", "Příliš žluťoučký kůň úpěl ďábelské ódy",
    "Straße und Grüße, ÄÖÜ", "İstanbul'da ISTANBUL", "我爱北京天安门。", "ねこがすきです",
    "안녕하세요 세계", "مَرْحَبًا بالعالم", "लड़की नमस्ते दुनिया", "Привет, МИР! Ёлка",
    "😀 smile 👍🏽 👨‍👩‍👧 family", "", "  ", "tab\there\nnew\u00a0nbsp\u3000ideo",
    "ctrl\x07char zw\u200bsp soft\u00adhyphen", "A man in a RED shirt is riding a bike.",
    "Ein Mann fährt Fahrrad", "ﬁne Ｆｕｌｌ", "x" * 99, "y" * 101,
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _bert_vocab(path, lowercase: bool):
  """A wordpiece vocabulary learned by `tokenizers`' own trainer from the sample, written in
  multilingual BERT's layout (specials not at mural's ids)."""
  trainer = BertWordPieceTokenizer(lowercase=lowercase)
  trainer.train_from_iterator(SAMPLE * 3, vocab_size=200, min_frequency=1,
                              special_tokens=SPECIALS, limit_alphabet=80)
  learned = sorted(trainer.get_vocab().items(), key=lambda kv: kv[1])
  body = [t for t, _ in learned if t not in SPECIALS]
  vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 6)] + SPECIALS[1:] + body
  path.write_text("".join(t + "\n" for t in vocab))
  return str(path)


@pytest.mark.parametrize("normalization", ["bert_cased", "bert_uncased"])
def test_ids_equal_the_reference_tokenizers(tmp_path, normalization):
  lowercase = normalization == "bert_uncased"
  vocab = _bert_vocab(tmp_path / "vocab.txt", lowercase)
  reference = BertWordPieceTokenizer(vocab, lowercase=lowercase)
  ours = tok_lib.Tokenizer(vocab, 128, normalization)
  assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id) == (0, 6, 7, 8)
  ids, mask = (a.numpy() for a in ours.tokenize(SAMPLE))
  unknown = 0
  for row, text in enumerate(SAMPLE):
    expected = reference.encode(text).ids
    assert [int(i) for i, m in zip(ids[row], mask[row]) if m] == expected, text
    assert all(i == ours.pad_id for i in ids[row][len(expected):])
    unknown += expected.count(ours.unk_id)
  assert unknown >= 3  # The emoji words and the 101-character word: [UNK] as one word.


def test_a_bert_vocabulary_without_a_special_token_is_one_error(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("[PAD]\n[CLS]\n[SEP]\nhello\n")
  with pytest.raises(ValueError, match=r"no \[UNK\] token"):
    tok_lib.Tokenizer(str(path), 16, "bert_cased")
  with pytest.raises(ValueError, match="not in"):
    tok_lib.Tokenizer(str(path), 16, "lowercase")
