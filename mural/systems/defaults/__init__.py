"""Each system's config defaults, one light module per system (what config files import)."""
