"""Search an index with a text or an image query, embedded by an export.

  python -m mural.search --export=DIR --index=IDX --query="ein roter Kreis" -k 10
  python -m mural.search --export=DIR --index=IDX --image=photo.jpg -k 10

Prints one line per hit: rank, score (cosine), id. Any query kind works on
any index kind: text -> images, image -> texts, text -> texts, image -> images
(all embed into one space through the system's retrieval heads).
"""

import argparse
import sys


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m mural.search", description=__doc__.split("\n")[0])
  parser.add_argument("--export", required=True, help="Export directory (--mode=export).")
  parser.add_argument("--index", required=True, help="Index directory (python -m mural.index).")
  parser.add_argument("--query", help="Text query.")
  parser.add_argument("--image", help="Image file query.")
  parser.add_argument("--lang", help="The text query's language code, for an export with a "
                                     "vocabulary per language (MULE); others ignore it.")
  parser.add_argument("-k", type=int, default=10, help="Hits to print.")
  args = parser.parse_args(argv)
  if (args.query is None) == (args.image is None):
    print("mural.search: error: give exactly one of --query and --image", file=sys.stderr)
    return 2
  if args.query is not None and not args.query.strip():
    print("mural.search: error: --query is empty", file=sys.stderr)
    return 2
  if args.k < 1:
    print(f"mural.search: error: -k must be >= 1, got {args.k}", file=sys.stderr)
    return 2
  from mural import data  # pylint: disable=g-import-not-at-top
  data.set_tensorflow_env_defaults()  # Before TensorFlow loads.
  try:
    from mural import embed  # pylint: disable=g-import-not-at-top
    from mural import export  # pylint: disable=g-import-not-at-top
    from mural import index as index_lib  # pylint: disable=g-import-not-at-top
    index = index_lib.Index(args.index)
    model = export.load(args.export, batch_size=1)
    if index.meta.get("dim") != model.embed_dim:
      raise ValueError(f"index {args.index} holds {index.meta.get('dim')}-d vectors, the export embeds "
                       f"to {model.embed_dim}")
    if args.query is not None:
      embed.check_lang(model, args.lang)
      query = model.embed_texts([args.query], args.lang)
    else:
      query = model.embed_images([args.image])
    scores, ids = index.search(query, args.k)
  except (FileNotFoundError, ValueError) as e:
    print(f"mural.search: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 1
  for rank, (score, hit) in enumerate(zip(scores[0], ids[0]), 1):
    print(f"{rank}\t{score:.4f}\t{hit}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
