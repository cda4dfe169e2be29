"""Where a dataset folder is: an explicit path, else an environment variable naming it."""

import os
from typing import Optional, Sequence


def resolve_data_dir(path: Optional[str], env_var: str, title: str, markers: Sequence[str] = ()) -> str:
  """path, else $env_var; ValueError naming what was tried.

  The folder must exist and hold one of `markers` (files or folders) when
  there are any, so a wrong folder fails here, with its name, not later
  inside tf.data.
  """
  if path:
    d, where = path, "the source's path"
  elif os.environ.get(env_var):
    d, where = os.environ[env_var], f"${env_var}"
  else:
    raise ValueError(f"{title}: no folder given; set the source's 'path' or ${env_var} "
                     "(docs/data.md says where the release is published)")
  if not os.path.isdir(d) or markers and not any(os.path.exists(os.path.join(d, m)) for m in markers):
    lacks = f" or lacks {' or '.join(markers)}" if markers else ""
    raise ValueError(f"{title} directory {d} ({where}) does not exist{lacks}; set the source's 'path' or ${env_var}")
  return d
