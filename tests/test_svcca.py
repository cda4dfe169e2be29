"""mural.svcca against independent references: Pearson's r in one dimension, CCA from the
covariance matrices in float64, and the invariances SVCCA is defined by."""

import numpy as np
import pytest

from mural import svcca


def _inverse_sqrt(c):
  w, v = np.linalg.eigh(c)
  return v @ np.diag(w ** -0.5) @ v.T


def reference_cca(x, y):
  """Canonical correlations as the textbook writes them: singular values of
  Sxx^-1/2 Sxy Syy^-1/2 (Hotelling 1936), from the sample covariances."""
  x, y = x - x.mean(0), y - y.mean(0)
  n = len(x)
  sxx, syy, sxy = x.T @ x / (n - 1), y.T @ y / (n - 1), x.T @ y / (n - 1)
  return np.linalg.svd(_inverse_sqrt(sxx) @ sxy @ _inverse_sqrt(syy), compute_uv=False)


def test_one_dimension_is_the_absolute_pearson_correlation():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(500, 1))
  y = -0.6 * x + rng.normal(size=(500, 1))
  r = np.corrcoef(x[:, 0], y[:, 0])[0, 1]
  assert svcca.svcca(x, y, keep=1.0) == pytest.approx(abs(r), abs=1e-12)
  # Hand-computed: y = 2x + 1 exactly.
  assert svcca.svcca(np.array([[0.0], [1.0], [2.0], [4.0]]), np.array([[1.0], [3.0], [5.0], [9.0]]),
                     keep=1.0) == pytest.approx(1.0, abs=1e-12)


def test_canonical_correlations_match_the_covariance_formula():
  rng = np.random.default_rng(1)
  shared = rng.normal(size=(400, 3))
  x = shared @ rng.normal(size=(3, 6)) + rng.normal(size=(400, 6))
  y = shared @ rng.normal(size=(3, 5)) + 2.0 * rng.normal(size=(400, 5))
  np.testing.assert_allclose(svcca.canonical_correlations(x, y, keep=1.0), reference_cca(x, y), atol=1e-10)
  # Unrelated views: well below related ones.
  assert svcca.svcca(x, rng.normal(size=(400, 5)), keep=1.0) < 0.15 < svcca.svcca(x, y, keep=1.0)


def test_a_linear_map_of_a_view_is_the_same_view():
  """CCA is blind to any invertible linear map (and a shift); after the SV step, to a rotation
  and a scale, which keep the variance spectrum and so the kept directions."""
  rng = np.random.default_rng(2)
  x = rng.normal(size=(300, 8)) * np.arange(1, 9)
  y = x @ rng.normal(size=(8, 8)) + 5.0  # Invertible (almost surely), shifted.
  assert svcca.svcca(x, y, keep=1.0) == pytest.approx(1.0, abs=1e-9)
  rotation = np.linalg.qr(rng.normal(size=(8, 8)))[0]
  assert svcca.svcca(x, 3.0 * x @ rotation - 1.0) == pytest.approx(1.0, abs=1e-9)


def test_the_sv_step_keeps_the_directions_holding_the_variance():
  rng = np.random.default_rng(3)
  strong = rng.normal(size=(1000, 3)) @ rng.normal(size=(3, 20)) * 10.0
  x = strong + 0.01 * rng.normal(size=(1000, 20))  # Three directions hold > 99.9% of it.
  assert svcca._kept_basis(x, 0.99).shape == (1000, 3)  # pylint: disable=protected-access
  assert svcca._kept_basis(x, 1.0).shape == (1000, 20)  # pylint: disable=protected-access
  # Two noisy copies of one signal: with the noise directions dropped they are one view; kept,
  # 17 of the 20 correlations are noise against noise.
  other = strong + 0.01 * rng.normal(size=(1000, 20))
  assert svcca.svcca(x, other) == pytest.approx(1.0, abs=1e-6)
  assert svcca.svcca(x, other, keep=1.0) < 0.3


def test_bad_input_is_a_clear_error(tmp_path):
  rng = np.random.default_rng(4)
  with pytest.raises(ValueError, match="must be the same points"):
    svcca.svcca(rng.normal(size=(50, 2)), rng.normal(size=(40, 2)))
  with pytest.raises(ValueError, match="CCA needs at least twice as many points"):
    svcca.svcca(rng.normal(size=(10, 8)), rng.normal(size=(10, 8)), keep=1.0)
  for n in (1, 2):  # Not "a view is constant": too few sentences.
    with pytest.raises(ValueError, match=f"svcca: {n} points; it compares many"):
      svcca.svcca(rng.normal(size=(n, 1)), rng.normal(size=(n, 1)))
  with pytest.raises(ValueError, match="a view is constant"):
    svcca.svcca(np.ones((50, 3)), rng.normal(size=(50, 3)))
  with pytest.raises(ValueError, match=r"keep must be in \(0, 1\]"):
    svcca.svcca(rng.normal(size=(50, 2)), rng.normal(size=(50, 2)), keep=0.0)
  tsv = tmp_path / "parallel.tsv"
  tsv.write_text("en\tde\na red circle\tein roter Kreis\ntwo\n")
  with pytest.raises(ValueError, match=r"rows \[3\] do not have 2 fields"):
    svcca.read_parallel_tsv(str(tsv))
  tsv.write_text('en\tde\n"Red" circle\tein „roter“ Kreis\n')  # Quotes are text, even leading ones.
  assert svcca.read_parallel_tsv(str(tsv)) == {"en": ['"Red" circle'], "de": ["ein „roter“ Kreis"]}


def test_similarity_matrix_is_symmetric_with_ones_on_its_diagonal():
  rng = np.random.default_rng(5)
  base = rng.normal(size=(200, 4))
  views = {"en": base, "de": base @ rng.normal(size=(4, 4)), "sw": rng.normal(size=(200, 4))}
  m = svcca.similarity_matrix(views, keep=1.0)
  assert [m[a][a] for a in views] == [1.0, 1.0, 1.0]
  assert all(m[a][b] == m[b][a] for a in views for b in views)
  assert m["en"]["de"] == pytest.approx(1.0, abs=1e-9) and m["en"]["sw"] < 0.3
  assert svcca.format_matrix(m).splitlines()[0].split() == ["en", "de", "sw"]


def test_laplacian_eigenmap_matches_the_generalized_eigenproblem_and_splits_clusters():
  import scipy.linalg  # pylint: disable=g-import-not-at-top
  langs = ["en", "de", "ja", "hi", "sw"]
  close = {frozenset(p) for p in (("en", "de"), ("ja", "hi"))}
  matrix = {a: {b: 1.0 if a == b else 0.95 if frozenset((a, b)) in close else 0.3 + 0.01 * (i + j)
                for j, b in enumerate(langs)} for i, a in enumerate(langs)}
  got = svcca.laplacian_eigenmap(matrix)
  w = np.array([[matrix[a][b] for b in langs] for a in langs])
  d = np.diag(w.sum(1))
  _, want = scipy.linalg.eigh(d - w, d)  # Belkin and Niyogi's L v = lambda D v, independently.
  for axis in range(2):
    column = np.array([got[lang][axis] for lang in langs])
    reference = want[:, axis + 1]
    np.testing.assert_allclose(np.abs(column @ d @ reference), 1.0, atol=1e-9)  # v'Dv = 1 alike.
    np.testing.assert_allclose(column, np.sign(column @ d @ reference) * reference, atol=1e-9)
  first = {lang: got[lang][0] for lang in langs}
  assert np.sign(first["en"]) == np.sign(first["de"]) != np.sign(first["ja"]) == np.sign(first["hi"])
  two = svcca.laplacian_eigenmap({"en": {"en": 1.0, "de": 0.5}, "de": {"en": 0.5, "de": 1.0}})
  assert [len(v) for v in two.values()] == [1, 1]  # n - 1 axes at most.


def test_the_command_line_says_what_is_missing_in_one_line(tmp_path, capsys):
  assert svcca.cli(["--export", str(tmp_path / "nowhere")]) == 1
  assert capsys.readouterr().err == f"mural.svcca: error: {tmp_path / 'nowhere' / 'config.json'}: no such file " \
                                    "(--mode=train writes it in a workdir, --mode=export in an export)\n"
  assert svcca.cli(["--export", str(tmp_path), "--texts", str(tmp_path / "none.tsv")]) == 1
  assert "No such file or directory" in capsys.readouterr().err
