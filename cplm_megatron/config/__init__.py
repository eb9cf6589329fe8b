"""Config loading: YAML recipes, dotted overrides, strict dataclasses."""
