"""A public BERT vocabulary tokenizes as its own tokenizer does: mural's Tokenizer against
Hugging Face's `tokenizers` (BertWordPieceTokenizer: BERT's normaliser, pre-tokenizer and
wordpiece), cased and uncased, on a multilingual sample, with the vocabulary laid out as
multilingual BERT's is ([PAD], [unused*], then [UNK], [CLS], [SEP], [MASK])."""

import pytest
from tokenizers import BertWordPieceTokenizer

from mural.data import tokenizer as tok_lib

from pretrained_fixtures import bert_vocab
from pretrained_fixtures import MULTILINGUAL as SAMPLE


def _write(path, vocab):
  path.write_text("".join(t + "\n" for t in vocab))
  return str(path)


@pytest.mark.parametrize("normalization", ["bert_cased", "bert_uncased"])
def test_ids_equal_the_reference_tokenizers(tmp_path, normalization):
  lowercase = normalization == "bert_uncased"
  vocab = _write(tmp_path / "vocab.txt", bert_vocab(lowercase))
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
