"""Public checkpoints into a directory a run starts from (`config.init_from`).

  python -m mural.import_weights --text=hf_bert:bert-base-multilingual-cased \\
      --image=keras_efficientnet:efficientnetb0_notop.h5 --out=imported

--text / --image: FORMAT:PATH (mural.pretrained.FORMATS; the checkpoint is read where it is,
nothing is downloaded). Text options: --max_len (the tokenizer's length: the position table
keeps that many rows), --pooler (embed through BERT's pooler, as LaBSE does), --lower_case
(true / false; default: what the checkpoint says). Image option: --normalization (the
pixel normalisation of a TF reference or timm EfficientNet, whose files do not say it). OUT then holds params.msgpack, config.json
(the towers' config fields), vocab.txt and manifest.json (which source tensor became which
variable; what was left out, and why). A config file takes it with
`config_lib.towers_from(config, OUT)`.
"""

import argparse
import resource
import sys
import time

from mural import pretrained
from mural.pretrained import writer


def _bool(value: str) -> bool:
  if value.lower() not in ("true", "false"):
    raise argparse.ArgumentTypeError(f"{value!r}: true or false")
  return value.lower() == "true"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m mural.import_weights", description=__doc__.split("\n")[0])
  parser.add_argument("--text", default="", help="FORMAT:PATH of a text tower checkpoint")
  parser.add_argument("--image", default="", help="FORMAT:PATH of an image tower checkpoint")
  parser.add_argument("--out", required=True, help="the directory to write")
  parser.add_argument("--max_len", type=int, default=64)
  parser.add_argument("--pooler", type=_bool, default=False)
  parser.add_argument("--lower_case", type=_bool, default=None)
  parser.add_argument("--normalization", default=None,
                      help="tf_efficientnet, timm_efficientnet: the checkpoint's pixel normalisation, "
                           "imagenet (default) or inception ([-1, 1]: AdvProp)")
  args = parser.parse_args(argv)
  start = time.time()
  try:
    towers = []
    for kind, spec in (("text", args.text), ("image", args.image)):
      if not spec:
        continue
      name = spec.partition(":")[0]
      if name in pretrained.FORMATS and pretrained.FORMATS[name][0] != kind:
        raise pretrained.CheckpointError(f"--{kind}={spec}: {name} is a {pretrained.FORMATS[name][0]} tower format")
      options = dict(max_len=args.max_len, pooler=args.pooler, lower_case=args.lower_case) if kind == "text" else {}
      if args.normalization is not None:
        if name not in ("tf_efficientnet", "timm_efficientnet"):
          raise pretrained.CheckpointError(f"--normalization: {name} reads its normalisation from the checkpoint")
        options["normalization"] = args.normalization
      towers.append(pretrained.read(spec, **options))
    if not towers:
      raise pretrained.CheckpointError("nothing to import: give --text, --image or both")
    names = ", ".join(f"{t.kind}: {t.source['format']} {t.source['path']}" for t in towers)
    print(f"Importing {names}")
    manifest = writer.write(args.out, towers)
  except (pretrained.CheckpointError, OSError) as e:
    print(f"mural.import_weights: error: {e}", file=sys.stderr)
    return 1
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  for kind, tower in manifest["towers"].items():
    print(f"{kind} tower: {len(tower['tensors'])} tensors imported, {len(tower['not_imported'])} "
          f"left out (manifest.json says why)")
  print(f"Wrote {args.out}: {manifest['values'] / 1e6:.1f}M values in {time.time() - start:.1f} s, "
        f"peak host memory {peak:.0f} MiB")
  return 0


if __name__ == "__main__":
  sys.exit(main())
