"""Where a dataset folder is: an explicit path, else an environment variable, else ../shared/data."""

import os
from typing import Optional

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve_data_dir(path: Optional[str], env_var: str, default_name: str, marker: str,
                     title: str) -> str:
  """path -> $env_var -> <repo>/../shared/data/<default_name>; ValueError naming what was tried.

  `marker` is a file or folder the dataset must contain (so a wrong folder
  fails here, with its name, not later inside tf.data).
  """
  if path:
    d, where = path, "the source's path"
  elif os.environ.get(env_var):
    d, where = os.environ[env_var], f"${env_var}"
  else:
    d, where = os.path.normpath(os.path.join(_REPO, "..", "shared", "data", default_name)), "the default"
  if not os.path.exists(os.path.join(d, marker)):
    raise ValueError(f"{title} directory {d} ({where}) does not exist or lacks {marker}; "
                     f"set the source's 'path' or ${env_var}")
  return d
