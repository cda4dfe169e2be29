"""benchmarks/mural_claim.py: the summary's means over seeds and the three targets, its errors,
--reuse and progress lines (no run is trained to the end)."""

import json
import pathlib
import sys

import pytest

from conftest import load_benchmark


def _eval(en, de, sw):
  return {"en/mR": en, "de/mR": de, "sw/mR": sw}


def test_summary_averages_seeds_and_reads_the_targets():
  claim = load_benchmark("mural_claim")
  results = {
      0: {"align": _eval(80, 70, 20), "mural": _eval(81, 70, 60), "control": _eval(80, 72, 30)},
      1: {"align": _eval(60, 50, 10), "mural": _eval(61, 51, 40), "control": _eval(62, 52, 20)},
  }
  got = claim.summarize(results, ["en", "de", "sw"], "sw")
  # By hand: align en (80+60)/2 = 70, de 60, sw 15; mural 71, 60.5, 50; control 71, 62, 25.
  assert got["mR"]["align"] == {"en": 70, "de": 60, "sw": 15}
  assert got["mR"]["mural"] == {"en": 71, "de": 60.5, "sw": 50}
  assert got["rich"] == {"align": 65, "mural": 65.75, "control": 66.5}
  assert got["gap"] == {"align": -50, "mural": -15.75, "control": -41.5}
  assert got["lift"] == {"align": 0, "mural": 35, "control": 10}
  assert got["per_seed"][1]["mural"] == (40, 56)
  # Lift 35 >= 10; rich 65.75 vs 65 within 1; the control's lift of exactly 10 is still a lift.
  assert got["targets"] == {"lift": True, "rich_within_1": True, "rich_not_below": True,
                            "control_loses_lift": False}

  results[1]["mural"]["en/mR"] = 65  # Rich mean 66.75: 1.75 above ALIGN's.
  results[1]["control"]["sw/mR"] = 19.8  # Control sw 24.9: lift 9.9.
  got = claim.summarize(results, ["en", "de", "sw"], "sw")
  assert got["rich"]["mural"] == pytest.approx(66.75)
  assert got["targets"] == {"lift": True, "rich_within_1": False, "rich_not_below": True,
                            "control_loses_lift": True}

  results[1]["mural"]["en/mR"] = 53  # En (81+53)/2 = 67, rich mean 63.75: 1.25 below ALIGN's 65.
  got = claim.summarize(results, ["en", "de", "sw"], "sw")
  assert got["rich"]["mural"] == pytest.approx(63.75)
  assert not got["targets"]["rich_within_1"] and not got["targets"]["rich_not_below"]


def test_scarce_coverage_reads_the_scarce_languages_own_captions():
  """Checked against the captions found by walking the whole training mix (image_text_example)."""
  from mural import config_lib  # pylint: disable=g-import-not-at-top
  from mural.data import synthetic  # pylint: disable=g-import-not-at-top
  claim = load_benchmark("mural_claim")
  config = config_lib.base_config()
  s = config.data.synthetic
  s.languages, s.pairs_per_language, s.default_pairs, s.eval_scenes = ("en", "sw"), {"sw": 4}, 30, 40
  s.render_size = 8
  settings = synthetic.Settings.from_config(config)
  walked = [synthetic.image_text_example(settings, "train", i, with_image=False) for i in range(34)]
  want = set().union(*(claim.caption_words(c) for _, _, c, lang in walked if lang == "sw"))
  seen, held, scenes, total = claim.scarce_coverage(config, "sw")
  assert seen == want and 0 < len(seen) < len(held | seen)
  data = synthetic.build_eval_data(config).languages["sw"]
  assert held == set().union(*map(claim.caption_words, data.captions)) and total == 40
  assert scenes == len({k for c, k in zip(data.captions, data.text_to_image) if claim.caption_words(c) - want}) > 0
  assert claim.caption_words("Kuna mduara mdogo, na nyota.") == {"kuna", "mduara", "mdogo", "na", "nyota"}


@pytest.mark.parametrize("flag, says", [
    ("--scarce_pairs=-1", "pairs_per_language.sw: must be an int >= 0, got -1"),
    ("--set=data.synthetic.eval_scenes=0", "eval_scenes: must be an int >= 1, got 0"),
])
def test_bad_data_settings_are_one_line_before_any_run(monkeypatch, tmp_path, flag, says):
  claim = load_benchmark("mural_claim")
  monkeypatch.setattr("sys.argv", ["mural_claim.py", "--languages=en,de,sw", f"--workdir={tmp_path}", flag])
  with pytest.raises(SystemExit) as exit_info:
    claim.main()
  assert str(exit_info.value).startswith("mural_claim: --scarce_pairs / --set: config.data.synthetic.")
  assert says in str(exit_info.value) and not list(tmp_path.iterdir())  # No run started.


def test_a_failing_run_stops_the_script_with_its_error_line(monkeypatch, tmp_path):
  """A value only mural.main checks (here --steps) fails the first run: its error, not just a log path."""
  claim = load_benchmark("mural_claim")
  monkeypatch.setattr("sys.argv", ["mural_claim.py", "--languages=en,de,sw", f"--workdir={tmp_path}", "--steps=0"])
  with pytest.raises(SystemExit) as exit_info:
    claim.main()
  assert str(exit_info.value).startswith("mural_claim: run 'mural' failed (exit 2): mural: error: "
                                         "config.total_steps: must be positive\n  see ")
  assert not (tmp_path / "mural" / "eval").exists()


def test_reuse_reads_a_finished_run_only_when_its_recorded_flags_are_the_same(monkeypatch, tmp_path, capsys):
  """--reuse adds seeds to a finished claim without training its runs again; a run recorded with
  other flags (another --set, --steps, seed) is trained, not read. mural.main is replaced by a
  stand-in that writes a final eval from the seed flag: what is checked is which runs start."""
  claim = load_benchmark("mural_claim")
  trained = []

  def train(args, log_path, name):
    trained.append(args)
    out = pathlib.Path(next(a for a in args if a.startswith("--workdir=")).split("=", 1)[1])
    seed = int(next(a for a in args if a.startswith("--config.seed=")).split("=", 1)[1])
    (out / "eval").mkdir(parents=True, exist_ok=True)
    (out / "eval" / "step_7.json").write_text(json.dumps({"sw/mR": 10.0 * seed}))
    return 0, ""

  monkeypatch.setattr(claim, "train", train)
  assert claim.run("mural", tmp_path, 7, ["--config.seed=2"], None) == {"sw/mR": 20.0}
  assert json.loads((tmp_path / "mural.args.json").read_text()) == trained[0][1:]
  capsys.readouterr()
  assert claim.run("mural", tmp_path, 7, ["--config.seed=2"], None, reuse=True, label="seed 2 mural") == {"sw/mR": 20.0}
  assert len(trained) == 1 and capsys.readouterr().out.startswith("seed 2 mural: reused ")
  assert claim.run("mural", tmp_path, 7, ["--config.seed=3"], None, reuse=True) == {"sw/mR": 30.0}
  assert len(trained) == 2 and "mural.args.json records other flags" in capsys.readouterr().out
  assert json.loads((tmp_path / "mural.args.json").read_text()) == trained[1][1:]
  assert claim.run("mural", tmp_path, 7, ["--config.seed=3"], None) == {"sw/mR": 30.0}
  assert len(trained) == 3  # Without --reuse every run trains.


def test_train_logs_everything_and_shows_progress_lines(tmp_path, capsys):
  claim = load_benchmark("mural_claim")
  script = ("print('I1130 metric_log.py:83] step 100/200  loss 7.8  21.2 steps/s  ETA 0:00:05'); "
            "print('I1130 train.py:288] Initialised 5 parameters.'); raise SystemExit(3)")
  rc, last = claim.train([sys.executable, "-c", script], tmp_path / "run.log", "align", every_s=0)
  assert rc == 3 and last == "I1130 train.py:288] Initialised 5 parameters."
  assert capsys.readouterr().out == "align: step 100/200  loss 7.8  21.2 steps/s  ETA 0:00:05\n"
  assert (tmp_path / "run.log").read_text().splitlines()[1] == "I1130 train.py:288] Initialised 5 parameters."
